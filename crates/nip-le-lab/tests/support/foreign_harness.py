#!/usr/bin/env python3
"""An independent, minimal NIP-LE writer that follows INTEROP.md's write
format, written in another language on purpose so that interop tests never
exercise our own code path on both sides.

Behaviour, as INTEROP.md describes the existing harness:
- blocking exclusive flock on the lock file itself, opened read+write+create
  without truncation, held across read-decide-write;
- write in place: seek 0, truncate 0, write the JSON, flush;
- body {"instance_id":…,"pid":…,"claimed_at":"<RFC 3339 UTC>"} in that order;
- takeable: empty/malformed, own id, pid dead (ESRCH), claimed_at older than
  stale (unparseable counts as stale, future does not);
- acquire once at start, then every refresh: acquire, then re-read;
- release on SIGTERM: truncate to 0 only when the file names us.

It prints JSON lines like `nip-le run`: started, leadership (on change),
stopped.
"""
import argparse, datetime, fcntl, json, os, signal, sys, time

p = argparse.ArgumentParser()
p.add_argument("--lock-dir", required=True)
p.add_argument("--pubkey", required=True)
p.add_argument("--instance-id", required=True)
p.add_argument("--refresh-ms", type=int, default=5000)
p.add_argument("--stale-ms", type=int, default=10000)
# Tests only: append a line to this file after every write of ours (our
# record may be overwritten again before a test can read it).
p.add_argument("--log-writes", default=None)
a = p.parse_args()
path = os.path.join(a.lock_dir, a.pubkey + ".lock")
os.makedirs(a.lock_dir, exist_ok=True)


def emit(**kv):
    sys.stdout.write(json.dumps(kv) + "\n")
    sys.stdout.flush()


def now_ms():
    return int(time.time() * 1000)


def parse(raw):
    try:
        rec = json.loads(raw)
        if not (isinstance(rec["instance_id"], str) and isinstance(rec["pid"], int)
                and isinstance(rec["claimed_at"], str)):
            return None
        return rec
    except Exception:
        return None


def pid_dead(pid):
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True
    except PermissionError:
        return False


def stale(claimed_at):
    try:
        t = datetime.datetime.fromisoformat(claimed_at)
    except ValueError:
        return True
    age = datetime.datetime.now(datetime.timezone.utc) - t
    return age.total_seconds() * 1000 > a.stale_ms


def acquire():
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.lseek(fd, 0, os.SEEK_SET)
        rec = parse(os.read(fd, 65536))
        if rec is None or rec["instance_id"] == a.instance_id or pid_dead(rec["pid"]) or stale(rec["claimed_at"]):
            body = json.dumps({
                "instance_id": a.instance_id,
                "pid": os.getpid(),
                "claimed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            }, separators=(",", ":"))
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, body.encode())
            if a.log_writes:
                with open(a.log_writes, "a") as log:
                    log.write("wrote\n")
    finally:
        os.close(fd)


def read_is_leader():
    try:
        with open(path, "rb") as f:
            rec = parse(f.read())
    except OSError:
        return True
    return rec is None or rec["instance_id"] == a.instance_id


def release():
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    rec = parse(os.read(fd, 65536))
    if rec is not None and rec["instance_id"] == a.instance_id:
        os.ftruncate(fd, 0)
    os.close(fd)
    emit(event="stopped")
    sys.exit(0)


stopping = False


def on_term(*_):
    # Only a flag: the loop checks it between rounds. Raising from the
    # handler could land anywhere, even in acquire()'s `finally` before its
    # close, leaving that descriptor's flock held while release() waited
    # for one on another descriptor: the process waited on itself forever.
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_term)
emit(event="started", instance_id=a.instance_id, pid=os.getpid(), pubkey=a.pubkey)
cached = None
while not stopping:
    acquire()
    leader = read_is_leader()
    if leader != cached:
        cached = leader
        emit(event="leadership", pubkey=a.pubkey, is_leader=leader,
             reason="acquired" if leader else "lost", at_ms=now_ms())
    # A SIGTERM ends the sleep early only on the next round's check; the
    # wait is at most one refresh.
    if not stopping:
        time.sleep(a.refresh_ms / 1000)
release()
