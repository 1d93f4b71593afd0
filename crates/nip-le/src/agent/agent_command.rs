//! What to run as the agent: a program, its arguments and environment, and
//! its timings. [`super::CommandRunner`] runs it; the process layer spawns
//! it, so it lives apart from both.

use std::ffi::OsString;
use std::path::PathBuf;

use super::AgentTimings;

/// The agent command and its timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    /// The program (looked up in `PATH` when it has no directory).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to (or replacing those of) the environment;
    /// `BUZZ_INSTANCE_ELECTION_ID` is always set to the window's instance id.
    pub env: Vec<(OsString, OsString)>,
    /// Start from an empty environment (plus [`AgentCommand::env`] and the
    /// instance id) instead of the app's.
    pub env_clear: bool,
    /// The working directory (default: the app's).
    pub current_dir: Option<PathBuf>,
    /// The exit code with which the program says its instance lease is
    /// held elsewhere (such an exit is retried soon, like a busy start);
    /// `None`: every exit is a failure.
    pub busy_exit_code: Option<i32>,
    /// Stop, restart and busy-retry timings ([`AgentTimings::default`]).
    pub timings: AgentTimings,
}

impl AgentCommand {
    /// `program` with `args`, default timings.
    pub fn new<P, I, A>(program: P, args: I) -> Self
    where
        P: Into<OsString>,
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            env_clear: false,
            current_dir: None,
            busy_exit_code: None,
            timings: AgentTimings::default(),
        }
    }

    /// Checks the command and its timings.
    pub fn validate(&self) -> Result<(), String> {
        if self.program.is_empty() {
            return Err("the agent command is empty".into());
        }
        self.timings.validate()
    }

    /// The `PATH` the program is looked up in, when the command sets one.
    pub(super) fn env_path(&self) -> Option<OsString> {
        let set = self.env.iter().rev().find(|(k, _)| k == "PATH");
        match set {
            Some((_, v)) => Some(v.clone()),
            None if self.env_clear => Some(OsString::new()),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn commands_are_validated() {
        let ok = AgentCommand::new("agent", ["--x"]);
        ok.validate().unwrap();
        let mut c = ok.clone();
        c.program = OsString::new();
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.timings.grace = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = ok;
        c.timings.grace = Duration::MAX;
        assert!(c.validate().is_err(), "never an Instant overflow");
    }

    #[test]
    fn the_path_the_program_is_looked_up_in() {
        let mut c = AgentCommand::new("agent", Vec::<String>::new());
        assert_eq!(c.env_path(), None, "ours");
        c.env_clear = true;
        assert_eq!(c.env_path(), Some(OsString::new()), "none at all");
        c.env.push(("PATH".into(), "/a".into()));
        c.env.push(("PATH".into(), "/b".into()));
        assert_eq!(c.env_path(), Some("/b".into()), "the last one set");
    }
}
