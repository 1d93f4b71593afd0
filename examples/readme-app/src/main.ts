import { claim, isLeader, onLeadershipChanged, release } from 'tauri-plugin-leader-election-api'

const AGENT = '5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00'

console.log('leading:', await isLeader(AGENT)) // 1. leader or not
await onLeadershipChanged((c) => console.log(c.pubkey, c.isLeader ? 'leads here' : 'observes')) // 2. changes
document.querySelector('#take-over')?.addEventListener('click', () => void claim(AGENT)) // 3. claim
document.querySelector('#step-back')?.addEventListener('click', () => void release(AGENT)) // 4. release
