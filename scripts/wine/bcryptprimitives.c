/* ProcessPrng for Wine versions that lack it (Debian 12's Wine 8).
 *
 * Rust's standard library (1.78 and later) takes its random bytes from
 * ProcessPrng in bcryptprimitives.dll; without this export every Rust
 * program fails to start under such a Wine. This DLL provides it over
 * RtlGenRandom (advapi32's SystemFunction036), which Wine has. Built with
 * mingw by scripts/wine.sh and placed in the Wine prefix's system32; used
 * only to run the project's tests under Wine, never shipped. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk)) return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
