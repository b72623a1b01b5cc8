//! The messaging schedule: which replica of a stage processes a minibatch,
//! which peer each message goes to, and how many messages each link
//! carries — pure functions, the same on every rank.
//!
//! Minibatches are numbered globally, `0..iterations`, and every stage deals
//! them round-robin over its replicas: replica `g % width` of a stage
//! processes minibatch `g`. A message about minibatch `g` therefore goes
//! from replica `g % w_from` of the sending stage to replica `g % w_to` of
//! the receiving stage, and both sides compute that without talking. The
//! minibatches one sender replica `a` sends to one receiver replica `b` are
//! the `g` with `g ≡ a (mod w_from)` and `g ≡ b (mod w_to)`: none if
//! `a ≢ b (mod gcd)`, otherwise one every `lcm(w_from, w_to)` minibatches.
//! Counting them is exact for any iteration count — PipeDream asserts that
//! the count divides by the neighbour's width; here nothing needs to.
//!
//! [`one_f_one_b`] orders one replica's passes the 1F1B way (PipeDream's
//! "one forward, one backward" steady state after a warm-up), in a way
//! that cannot deadlock whatever the stages' widths.

/// One replica of a stage: its index among the stage's `width` replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Index within the stage, `0..width`.
    pub index: usize,
    /// Number of replicas of the stage (at least 1).
    pub width: usize,
}

impl Replica {
    /// Replica `index` of a stage of `width` replicas.
    pub const fn new(index: usize, width: usize) -> Self {
        Replica { index, width }
    }

    fn index64(self) -> u64 {
        self.index as u64
    }

    fn width64(self) -> u64 {
        self.width.max(1) as u64
    }
}

/// The replica (index within a stage of `width`) that processes `minibatch`.
pub fn replica_of(minibatch: u64, width: usize) -> usize {
    (minibatch % width.max(1) as u64) as usize
}

/// The minibatches of `0..iterations` that `replica` processes, in order.
pub fn local_minibatches(iterations: u64, replica: Replica) -> impl Iterator<Item = u64> {
    let step = replica.width64();
    let first = replica.index64();
    let count = local_count(iterations, replica);
    (0..count).map(move |k| first + k * step)
}

/// How many of the minibatches `0..iterations` `replica` processes.
pub fn local_count(iterations: u64, replica: Replica) -> u64 {
    progression_count(iterations, replica.index64(), replica.width64())
}

/// True when some minibatch goes from `from` to `to` (for enough
/// iterations): `from.index ≡ to.index (mod gcd(widths))`.
pub fn connected(from: Replica, to: Replica) -> bool {
    first_shared(from, to).is_some()
}

/// How many messages replica `from` of the sending stage sends to replica
/// `to` of the receiving stage over `iterations` minibatches (and so how
/// many `to` receives from `from`).
pub fn link_count(iterations: u64, from: Replica, to: Replica) -> u64 {
    match first_shared(from, to) {
        Some(first) => progression_count(iterations, first, lcm(from.width64(), to.width64())),
        None => 0,
    }
}

/// The minibatches replica `from` sends to replica `to`, in the order sent
/// and received.
pub fn link_minibatches(iterations: u64, from: Replica, to: Replica) -> impl Iterator<Item = u64> {
    let step = lcm(from.width64(), to.width64());
    let first = first_shared(from, to).unwrap_or(0);
    let count = link_count(iterations, from, to);
    (0..count).map(move |k| first + k * step)
}

/// The `n`-th minibatch (from 0) on the link `from → to`, without regard
/// to the iteration count; `None` if the replicas are not connected.
pub fn link_nth(from: Replica, to: Replica, n: u64) -> Option<u64> {
    let first = first_shared(from, to)?;
    n.checked_mul(lcm(from.width64(), to.width64()))?
        .checked_add(first)
}

/// The position of `minibatch` among the messages of the link `from → to`,
/// or `None` if the link does not carry it.
pub fn link_position(from: Replica, to: Replica, minibatch: u64) -> Option<u64> {
    let first = first_shared(from, to)?;
    let step = lcm(from.width64(), to.width64());
    let offset = minibatch.checked_sub(first)?;
    (offset % step == 0).then_some(offset / step)
}

/// One pass of a replica's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// The forward pass of a minibatch.
    Forward(u64),
    /// The backward pass of a minibatch.
    Backward(u64),
}

/// A replica's passes in 1F1B order. Stage `stage` of `num_stages` keeps
/// `warmup = num_stages - stage - 1` minibatches in flight: the forward
/// pass of minibatch `g` comes before the backward pass of `h` exactly when
/// `g <= h + warmup`. For a stage of one replica that is PipeDream's 1F1B
/// (warm-up forwards, alternate one forward and one backward, drain the
/// backwards). A replica of a wider stage keeps the same order restricted
/// to its own minibatches (`minibatches`, ascending: see
/// [`local_minibatches`]) — counting warm-up in its own minibatches instead
/// would run ahead of the stages around it and deadlock. Every minibatch
/// appears once forward and once backward, its forward first.
pub fn one_f_one_b(stage: usize, num_stages: usize, minibatches: &[u64]) -> Vec<Pass> {
    let warmup = num_stages.saturating_sub(stage + 1) as u64;
    let mut passes = Vec::with_capacity(2 * minibatches.len());
    let (mut f, mut b) = (0, 0);
    while b < minibatches.len() {
        match minibatches.get(f) {
            Some(&g) if g <= minibatches[b].saturating_add(warmup) => {
                passes.push(Pass::Forward(g));
                f += 1;
            }
            _ => {
                passes.push(Pass::Backward(minibatches[b]));
                b += 1;
            }
        }
    }
    passes
}

/// How many of `0..iterations` are `≡ first (mod step)` and `≥ first`.
fn progression_count(iterations: u64, first: u64, step: u64) -> u64 {
    if first >= iterations {
        0
    } else {
        (iterations - 1 - first) / step + 1
    }
}

/// The smallest minibatch that goes from `from` to `to`, if any.
fn first_shared(from: Replica, to: Replica) -> Option<u64> {
    if from.index >= from.width.max(1) || to.index >= to.width.max(1) {
        return None;
    }
    (0..to.width64())
        .map(|k| from.index64() + k * from.width64())
        .find(|g| g % to.width64() == to.index64())
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    (a / gcd(a, b).max(1)).saturating_mul(b)
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
