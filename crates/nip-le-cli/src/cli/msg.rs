//! What feeds `nip-le run`'s one channel: stdin lines, signals, leadership
//! changes, the mention feed, turn reports and relay frames. The threads
//! that send them and the loop that reads them all name it here.

use nip_le::LeadershipChange;
use serde_json::Value;

use crate::lines::Line;

/// One message to the run loop.
pub(super) enum Msg {
    Line(String),
    Signal,
    Change(LeadershipChange),
    ChangesClosed,
    Mention {
        id: Value,
        replied: bool,
        error: Option<String>,
    },
    /// `--turn-ms`: a line to print as is.
    Report(Line),
    /// `--relay`: a control frame the relay delivered.
    Relay(String),
}
