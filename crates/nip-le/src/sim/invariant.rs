//! What the simulator checks, one variant per invariant, each naming the
//! rules of the docs it guards by their ids (`LC` docs/lock-contract.md,
//! `EX` docs/extensions.md, `WL` docs/work-ledger.md, `XH`
//! docs/cross-host.md). docs/simulator.md lists them; `tests/rules.rs`
//! checks that every id named here is a rule of those docs.

/// A broken invariant's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Invariant {
    /// Two extended windows act while the lock file names one of them.
    TwoActingWindows,
    /// A record carries a lower epoch than one written before.
    EpochWentBackwards,
    /// One epoch named two holders.
    EpochIssuedTwice,
    /// A window wrote a key it had left.
    WriteAfterLeave,
    /// A writer or a contender panicked.
    Panic,
    /// A writer wakes again at once, forever.
    HotLoop,
    /// Nobody acted for longer than the bound of the faults in force.
    Silence,
    /// A mention was answered twice.
    AnsweredTwice,
    /// A mention was never answered.
    NeverAnswered,
    /// The work ledger grew past the size any process reads.
    LedgerPastReadCap,
    /// Two windows held etcd's key at once.
    TwoEtcdHolders,
    /// Two hosts acted at once under the stay-silent policy.
    TwoActingHosts,
    /// A contender left a key in a state its etcd-level phase forbids.
    ContenderPhase,
}

impl Invariant {
    /// Every invariant, in the order of their ids.
    pub const ALL: [Invariant; 13] = [
        Invariant::TwoActingWindows,
        Invariant::EpochWentBackwards,
        Invariant::EpochIssuedTwice,
        Invariant::WriteAfterLeave,
        Invariant::Panic,
        Invariant::HotLoop,
        Invariant::Silence,
        Invariant::AnsweredTwice,
        Invariant::NeverAnswered,
        Invariant::LedgerPastReadCap,
        Invariant::TwoEtcdHolders,
        Invariant::TwoActingHosts,
        Invariant::ContenderPhase,
    ];

    /// Its id: `S1` to `S10` on one host, `H1` to `H3` across hosts.
    pub fn id(self) -> &'static str {
        match self {
            Invariant::TwoActingWindows => "S1",
            Invariant::EpochWentBackwards => "S2",
            Invariant::EpochIssuedTwice => "S3",
            Invariant::WriteAfterLeave => "S4",
            Invariant::Panic => "S5",
            Invariant::HotLoop => "S6",
            Invariant::Silence => "S7",
            Invariant::AnsweredTwice => "S8",
            Invariant::NeverAnswered => "S9",
            Invariant::LedgerPastReadCap => "S10",
            Invariant::TwoEtcdHolders => "H1",
            Invariant::TwoActingHosts => "H2",
            Invariant::ContenderPhase => "H3",
        }
    }

    /// How a failed seed names it.
    pub fn what(self) -> &'static str {
        match self {
            Invariant::TwoActingWindows => "two acting windows",
            Invariant::EpochWentBackwards => "epoch went backwards",
            Invariant::EpochIssuedTwice => "epoch issued twice",
            Invariant::WriteAfterLeave => "write after leave",
            Invariant::Panic => "panic",
            Invariant::HotLoop => "hot loop",
            Invariant::Silence => "silence",
            Invariant::AnsweredTwice => "answered twice",
            Invariant::NeverAnswered => "never answered",
            Invariant::LedgerPastReadCap => "work ledger past its read cap",
            Invariant::TwoEtcdHolders => "two holders of etcd's key",
            Invariant::TwoActingHosts => "two acting hosts",
            Invariant::ContenderPhase => "a contender's key outside its phase",
        }
    }

    /// The rules of the docs it guards, by id.
    pub fn guards(self) -> &'static [&'static str] {
        match self {
            Invariant::TwoActingWindows => &["LC2", "LC13", "LC15", "LC17", "EX3", "EX4", "EX6"],
            Invariant::EpochWentBackwards => &["LC18", "EX5"],
            Invariant::EpochIssuedTwice => &["LC18", "EX5"],
            Invariant::WriteAfterLeave => &["EX3", "WL9"],
            Invariant::Panic => &["LC4"],
            Invariant::HotLoop => &["EX2"],
            Invariant::Silence => &["LC1", "LC13", "LC14", "LC15", "LC16", "EX1"],
            Invariant::AnsweredTwice => &["WL2", "WL3", "WL8", "WL10", "WL11", "WL12", "WL13"],
            Invariant::NeverAnswered => &["WL2", "WL4", "WL7", "WL9", "WL15", "WL16"],
            Invariant::LedgerPastReadCap => &["WL5", "WL6"],
            Invariant::TwoEtcdHolders => &["XH2", "XH8", "XH14"],
            Invariant::TwoActingHosts => &["XH9", "XH34"],
            Invariant::ContenderPhase => &["XH14", "XH17", "XH19"],
        }
    }
}

impl std::fmt::Display for Invariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what())
    }
}
