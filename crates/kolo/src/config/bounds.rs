//! The bounds of every count and duration in [`Config`](super::Config):
//! generous enough for any real job, tight enough that no value can
//! exhaust memory or overflow a clock (`Instant + d`). Each check is a pure
//! function from a value to `Ok` or the reason, shared by the environment
//! (which names the variable) and [`Config::validate`](super::Config::validate)
//! (which names the builder setting).

use std::time::Duration;

/// Largest fusion threshold: 64 GiB (all of `usize` where it is narrower).
/// A fused buffer holds a copy of the tensors it fuses; one larger than any
/// device's memory cannot help, and a lower threshold only means more
/// collectives, never other results.
pub const MAX_FUSION_THRESHOLD: usize = match 1usize.checked_shl(36) {
    Some(bytes) => bytes,
    None => usize::MAX,
};

/// Largest response cache capacity: 1,048,576 entries, far more tensors
/// than any model has. The cache grows with the tensors used, up to this;
/// a full one costs some hundred MB and a 384 KiB bit vector per cycle.
pub const MAX_CACHE_CAPACITY: usize = 1 << 20;

/// Longest cycle time: 60 s. An idle rank waits this long before it cycles
/// anyway, and peers wait on its cycles.
pub const MAX_CYCLE_TIME: Duration = Duration::from_secs(60);

/// Longest stall warning or shutdown time: 30 days.
pub const MAX_STALL_TIME: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A fusion threshold in bytes: at most [`MAX_FUSION_THRESHOLD`].
pub fn fusion_threshold(bytes: usize) -> Result<(), String> {
    at_most(bytes, MAX_FUSION_THRESHOLD, "bytes", "MAX_FUSION_THRESHOLD")
}

/// A cache capacity: at most [`MAX_CACHE_CAPACITY`] entries.
pub fn cache_capacity(entries: usize) -> Result<(), String> {
    at_most(entries, MAX_CACHE_CAPACITY, "entries", "MAX_CACHE_CAPACITY")
}

/// A cycle time: at most [`MAX_CYCLE_TIME`] (0 cycles without waiting).
pub fn cycle_time(time: Duration) -> Result<(), String> {
    if time > MAX_CYCLE_TIME {
        return Err(format!(
            "at most {MAX_CYCLE_TIME:?} (kolo::config::MAX_CYCLE_TIME)"
        ));
    }
    Ok(())
}

/// A stall time: positive and at most [`MAX_STALL_TIME`]; `None` turns it
/// off.
pub fn stall_time(time: Option<Duration>) -> Result<(), String> {
    match time {
        None => Ok(()),
        Some(Duration::ZERO) => {
            Err("must be longer than 0 (None, or 0 in the environment, turns it off)".into())
        }
        Some(t) if t > MAX_STALL_TIME => Err(format!(
            "at most {} s, 30 days (kolo::config::MAX_STALL_TIME)",
            MAX_STALL_TIME.as_secs()
        )),
        Some(_) => Ok(()),
    }
}

fn at_most(value: usize, max: usize, unit: &str, name: &str) -> Result<(), String> {
    if value > max {
        return Err(format!("at most {max} {unit} (kolo::config::{name})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_bound_just_inside_and_just_outside() {
        assert_eq!(fusion_threshold(0), Ok(()));
        assert_eq!(fusion_threshold(MAX_FUSION_THRESHOLD), Ok(()));
        if let Some(over) = MAX_FUSION_THRESHOLD.checked_add(1) {
            assert!(fusion_threshold(over).is_err_and(|r| r.contains("68719476736")));
        }
        assert_eq!(cache_capacity(0), Ok(()));
        assert_eq!(cache_capacity(MAX_CACHE_CAPACITY), Ok(()));
        assert!(cache_capacity(MAX_CACHE_CAPACITY + 1).is_err_and(|r| r.contains("1048576")));
        assert!(cache_capacity(usize::MAX).is_err());
        assert_eq!(cycle_time(Duration::ZERO), Ok(()));
        assert_eq!(cycle_time(MAX_CYCLE_TIME), Ok(()));
        let nanosecond = Duration::from_nanos(1);
        assert!(cycle_time(MAX_CYCLE_TIME + nanosecond).is_err_and(|r| r.contains("60s")));
        assert!(cycle_time(Duration::MAX).is_err());
        assert_eq!(stall_time(None), Ok(()));
        assert_eq!(stall_time(Some(nanosecond)), Ok(()));
        assert_eq!(stall_time(Some(MAX_STALL_TIME)), Ok(()));
        assert!(stall_time(Some(Duration::ZERO)).is_err_and(|r| r.contains("turns it off")));
        assert!(stall_time(Some(MAX_STALL_TIME + nanosecond)).is_err_and(|r| r.contains("2592000")));
        assert!(stall_time(Some(Duration::MAX)).is_err());
    }

    #[test]
    fn the_bounds_fit_a_clock() {
        // Whatever passes can be added to an instant.
        let now = std::time::Instant::now();
        assert!(now.checked_add(MAX_CYCLE_TIME).is_some());
        assert!(now.checked_add(MAX_STALL_TIME).is_some());
        assert_eq!(fusion_threshold(1 << 30), Ok(()), "1G is a valid threshold");
    }

    proptest! {
        #[test]
        fn a_check_passes_exactly_within_its_bound(n in any::<usize>(), ns in any::<u64>(), s in any::<u64>()) {
            prop_assert_eq!(fusion_threshold(n).is_ok(), n <= MAX_FUSION_THRESHOLD);
            prop_assert_eq!(cache_capacity(n).is_ok(), n <= MAX_CACHE_CAPACITY);
            let d = Duration::new(s, (ns % 1_000_000_000) as u32);
            prop_assert_eq!(cycle_time(d).is_ok(), d <= MAX_CYCLE_TIME);
            prop_assert_eq!(stall_time(Some(d)).is_ok(), !d.is_zero() && d <= MAX_STALL_TIME);
        }
    }
}
