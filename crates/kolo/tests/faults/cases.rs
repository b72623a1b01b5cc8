//! The table of fault cases: which rank is lost, when, at how many
//! processes. Each case is one job of the harness and one test line.

use std::fmt;

/// When the killed rank dies, relative to the training loop's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Right after `Kolo::init_ucx`, before any collective: the others'
    /// first step fails.
    Before,
    /// In step [`DURING_STEP`], after submitting its large allreduces,
    /// while the others' (and its own) are in flight.
    During,
    /// Once step [`AFTER_STEP`] completed: the others' next step fails.
    After,
}

impl Phase {
    /// Every phase, in the table's order.
    pub const ALL: [Phase; 3] = [Phase::Before, Phase::During, Phase::After];

    /// Steps the killed rank completes before it dies.
    pub fn steps_completed(self) -> usize {
        match self {
            Phase::Before => 0,
            Phase::During => DURING_STEP,
            Phase::After => AFTER_STEP + 1,
        }
    }

    /// The first step the killed rank never submits: no survivor can
    /// complete it, so the survivors' loop ends there at the latest.
    pub fn first_step_never_submitted(self) -> usize {
        match self {
            Phase::Before => 0,
            Phase::During => DURING_STEP + 1,
            Phase::After => AFTER_STEP + 1,
        }
    }

    /// The earliest step at which a survivor may fail: every survivor
    /// completed the steps before the last one the killed rank completed
    /// (it could not have completed that one without their data), so only
    /// the last of them may race with its death.
    pub fn earliest_failing_step(self) -> usize {
        self.steps_completed().saturating_sub(1)
    }

    fn label(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::During => "during",
            Phase::After => "after",
        }
    }
}

/// The step in which a [`Phase::During`] rank dies.
pub const DURING_STEP: usize = 2;
/// The last step a [`Phase::After`] rank completes.
pub const AFTER_STEP: usize = 1;

/// What goes wrong in a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `rank` kills itself with SIGKILL at `phase`.
    Killed { phase: Phase, rank: usize },
    /// Rank 0, the rendezvous store's host, exits 0 at once without
    /// starting kolo: the others never reach the store.
    StoreGoneAtStart,
}

/// One job: its test name, process count and fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    pub name: String,
    pub np: usize,
    pub fault: Fault,
}

impl Case {
    fn new(np: usize, fault: Fault) -> Case {
        let name = match fault {
            Fault::Killed { phase, rank } => {
                format!(
                    "ucx_tcp_rank{rank}_killed_{}_a_collective_np{np}",
                    phase.label()
                )
            }
            Fault::StoreGoneAtStart => format!("ucx_tcp_store_host_gone_at_start_np{np}"),
        };
        Case { name, np, fault }
    }

    /// The rank the fault takes away.
    pub fn lost_rank(&self) -> usize {
        match self.fault {
            Fault::Killed { rank, .. } => rank,
            Fault::StoreGoneAtStart => 0,
        }
    }

    /// `KOLO_RENDEZVOUS_TIMEOUT` of the job: short where the store is
    /// never reached (its expiry is what the case checks), generous
    /// elsewhere (4 processes on CI's 2 cores start slowly).
    pub fn rendezvous_timeout(&self) -> &'static str {
        match self.fault {
            Fault::StoreGoneAtStart => "5",
            Fault::Killed { .. } => "60",
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Every case: at 2, 3 and 4 processes, the last rank killed before,
/// during and after a collective; rank 0 (the rendezvous store's host)
/// killed during one; and the store's host gone before anyone connects.
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for np in [2, 3, 4] {
        for phase in Phase::ALL {
            cases.push(Case::new(
                np,
                Fault::Killed {
                    phase,
                    rank: np - 1,
                },
            ));
        }
        let phase = Phase::During;
        cases.push(Case::new(np, Fault::Killed { phase, rank: 0 }));
        cases.push(Case::new(np, Fault::StoreGoneAtStart));
    }
    cases
}

/// True when `text` names `rank` ("rank 3", not "rank 31").
pub fn names_rank(text: &str, rank: usize) -> bool {
    let needle = format!("rank {rank}");
    text.match_indices(&needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}
