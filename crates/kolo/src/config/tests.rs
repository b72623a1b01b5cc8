//! Reading the environment (as bytes), the bounds through both doors, and
//! never a panic on any input.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

fn from_raw(vars: &[(&str, &[u8])]) -> Result<Config, Error> {
    let map: HashMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from_vec(v.to_vec())))
        .collect();
    Config::from_lookup(&|name| map.get(name).cloned())
}

fn from_map(vars: &[(&str, &str)]) -> Result<Config, Error> {
    let raw: Vec<(&str, &[u8])> = vars.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    from_raw(&raw)
}

/// The variable, value and reason of a config error (panics otherwise).
fn config_error(result: Result<Config, Error>, what: &str) -> (String, String, String) {
    match result {
        Err(Error::Config {
            variable,
            value,
            reason,
        }) => (variable, value, reason),
        other => panic!("{what}: expected a config error, got {other:?}"),
    }
}

#[test]
fn nothing_set_gives_the_defaults() {
    assert_eq!(from_map(&[]), Ok(Config::default()));
    assert_eq!(from_map(&[(FUSION_THRESHOLD, " ")]), Ok(Config::default()));
    assert_eq!(from_map(&[(TIMELINE, "")]), Ok(Config::default()));
    assert_eq!(Config::default().validate(), Ok(()));
}

#[test]
fn every_variable_is_read() {
    let config = from_map(&[
        (FUSION_THRESHOLD, "64M"),
        (CYCLE_TIME, "2.5"),
        (TIMELINE, "/tmp/t.json"),
        (TIMELINE_MARK_CYCLES, "1"),
        (CACHE_CAPACITY, "0"),
        (STALL_CHECK_TIME_SECONDS, "0"),
        (STALL_SHUTDOWN_TIME_SECONDS, "30"),
        (LOG_LEVEL, "DEBUG"),
        (BACKEND, "mpi"),
        (MPI_THREADS_DISABLE, "yes"),
        (GPU, "off"),
        (START_TIMEOUT, "0"),
        (TIMEOUT, "12.5"),
        (AUTOTUNE, "on"),
    ]);
    let expected = Config::default()
        .fusion_threshold(64 << 20)
        .cycle_time(Duration::from_micros(2500))
        .timeline("/tmp/t.json")
        .timeline_mark_cycles(true)
        .cache_capacity(0)
        .stall_check(None)
        .stall_shutdown(Some(Duration::from_secs(30)))
        .log_level(LogLevel::Debug)
        .backend(BackendKind::Mpi)
        .mpi_threads_disable(true)
        .gpu(false)
        .start_timeout(None)
        .timeout(Duration::from_millis(12_500))
        .autotune(true);
    assert_eq!(config, Ok(expected));
}

#[test]
fn autotune_is_off_unless_asked_for() {
    assert!(!Config::default().autotune);
    assert!(Config::default().autotune(true).autotune);
    for (value, on) in [("1", true), ("true", true), ("0", false), ("off", false)] {
        assert_eq!(
            from_map(&[(AUTOTUNE, value)]).unwrap().autotune,
            on,
            "{value}"
        );
    }
}

#[test]
fn a_zero_timeout_means_none_and_the_stall_shutdown_takes_the_shorter() {
    assert_eq!(from_map(&[(TIMEOUT, "0")]).unwrap().timeout, None);
    let none = Config::default().timeout(Duration::ZERO);
    assert_eq!(none.timeout, None);
    assert!(!none.stall_is_timeout());
    assert_eq!(none.coordinator().stall_shutdown, None);
    let short = Config::default().timeout(Duration::from_secs(2));
    assert!(short.stall_is_timeout());
    assert_eq!(
        short.coordinator().stall_shutdown,
        Some(Duration::from_secs(2))
    );
    let stall_first = short.clone().stall_shutdown(Some(Duration::from_secs(1)));
    assert!(!stall_first.stall_is_timeout());
    assert_eq!(
        stall_first.coordinator().stall_shutdown,
        Some(Duration::from_secs(1))
    );
}

#[test]
fn a_malformed_value_names_variable_and_value() {
    for (variable, value) in [
        (FUSION_THRESHOLD, "lots"),
        (CYCLE_TIME, "-1"),
        (TIMELINE_MARK_CYCLES, "maybe"),
        (CACHE_CAPACITY, "1e3"),
        (STALL_CHECK_TIME_SECONDS, "soon"),
        (STALL_SHUTDOWN_TIME_SECONDS, "-5"),
        (LOG_LEVEL, "loud"),
        (BACKEND, "carrier-pigeon"),
        (MPI_THREADS_DISABLE, "2"),
        (GPU, "sometimes"),
        (AUTOTUNE, "auto"),
    ] {
        let what = format!("{variable}={value}");
        let (v, got, reason) = config_error(from_map(&[(variable, value)]), &what);
        assert_eq!((v.as_str(), got.as_str()), (variable, value));
        assert!(!reason.is_empty());
    }
}

/// Each bounded variable: the largest value it takes, the smallest one
/// past it (and a huge one), with the bound its reason names.
const ENV_BOUNDS: [(&str, &str, &[&str], &str); 5] = [
    (
        FUSION_THRESHOLD,
        "64G",
        &[
            "68719476737",
            "65G",
            "18446744073709551615",
            "99999999999999999999G",
        ],
        "68719476736",
    ),
    (
        CACHE_CAPACITY,
        "1048576",
        &["1048577", "18446744073709551615", "99999999999999999999999"],
        "1048576",
    ),
    (CYCLE_TIME, "60000", &["60000.001", "1e300"], "60s"),
    (
        STALL_CHECK_TIME_SECONDS,
        "2592000",
        &["2592000.001", "1e300"],
        "2592000",
    ),
    (
        STALL_SHUTDOWN_TIME_SECONDS,
        "2592000",
        &["2592000.001", "1e300"],
        "2592000",
    ),
];

#[test]
fn every_bound_from_the_environment_just_inside_and_outside() {
    for (variable, inside, outside, bound) in ENV_BOUNDS {
        let config = from_map(&[(variable, inside)]);
        assert!(
            config.as_ref().is_ok_and(|c| c.validate().is_ok()),
            "{variable}={inside}: {config:?}"
        );
        for value in outside {
            let what = format!("{variable}={value}");
            let (v, got, reason) = config_error(from_map(&[(variable, value)]), &what);
            assert_eq!((v.as_str(), got.as_str()), (variable, *value));
            assert!(reason.contains(bound), "{what}: {reason}");
        }
    }
    // A positive stall time shorter than a nanosecond is not "off".
    let (_, _, reason) = config_error(
        from_map(&[(STALL_SHUTDOWN_TIME_SECONDS, "1e-12")]),
        "1e-12 s",
    );
    assert!(reason.contains("nanosecond"), "{reason}");
}

#[test]
fn values_that_are_not_utf8_are_errors_naming_the_variable() {
    for variable in VARIABLES.into_iter().filter(|&v| v != TIMELINE) {
        let what = format!("{variable}=\\xff");
        let (v, value, reason) = config_error(from_raw(&[(variable, b"\xff")]), &what);
        assert_eq!((v.as_str(), value.as_str()), (variable, "\u{fffd}"));
        assert!(
            reason.contains("UTF-8") && reason.contains("0xff"),
            "{reason}"
        );
        // Valid text around the stray byte is kept in the message.
        let (_, value, _) = config_error(from_raw(&[(variable, b"12\xfe")]), &what);
        assert_eq!(value, "12\u{fffd}");
    }
    let shown = from_raw(&[(FUSION_THRESHOLD, b"12\xff")]).map_err(|e| e.to_string());
    assert_eq!(
        shown,
        Err(
            "invalid value \"12\u{fffd}\" for KOLO_FUSION_THRESHOLD: not valid UTF-8 \
             (0xff at byte 2); only a path (KOLO_TIMELINE) may hold other bytes"
                .into()
        )
    );
}

#[test]
fn a_timeline_path_keeps_its_bytes() {
    let path = b"/tmp/kolo-\xff\xfe/t.json";
    let config = from_raw(&[(TIMELINE, path)]);
    let timeline = config.ok().and_then(|c| c.timeline).unwrap_or_default();
    assert_eq!(timeline.as_os_str().as_bytes(), path);
    // Only blank is unset; other whitespace belongs to the path.
    let config = from_raw(&[(TIMELINE, b" t.json")]);
    assert_eq!(config.map(|c| c.timeline), Ok(Some(" t.json".into())));
}

/// Each bounded builder setting, a config just inside and just outside its
/// bound, the setting's name and the bound its reason names.
fn builder_bounds() -> Vec<(&'static str, Config, Config, &'static str)> {
    let d = Config::default();
    let ns = Duration::from_nanos(1);
    vec![
        (
            "Config::fusion_threshold",
            d.clone().fusion_threshold(MAX_FUSION_THRESHOLD),
            d.clone().fusion_threshold(MAX_FUSION_THRESHOLD + 1),
            "68719476736",
        ),
        (
            "Config::cycle_time",
            d.clone().cycle_time(MAX_CYCLE_TIME),
            d.clone().cycle_time(MAX_CYCLE_TIME + ns),
            "60s",
        ),
        (
            "Config::cache_capacity",
            d.clone().cache_capacity(MAX_CACHE_CAPACITY),
            d.clone().cache_capacity(MAX_CACHE_CAPACITY + 1),
            "1048576",
        ),
        (
            "Config::stall_check",
            d.clone().stall_check(Some(MAX_STALL_TIME)),
            d.clone().stall_check(Some(MAX_STALL_TIME + ns)),
            "2592000",
        ),
        (
            "Config::stall_check",
            d.clone().stall_check(Some(ns)),
            d.clone().stall_check(Some(Duration::ZERO)),
            "turns it off",
        ),
        (
            "Config::stall_shutdown",
            d.clone().stall_shutdown(Some(MAX_STALL_TIME)),
            d.clone().stall_shutdown(Some(Duration::MAX)),
            "2592000",
        ),
        (
            "Config::stall_shutdown",
            d.clone().stall_shutdown(Some(ns)),
            d.stall_shutdown(Some(Duration::ZERO)),
            "turns it off",
        ),
    ]
}

#[test]
fn every_bound_through_the_builder_just_inside_and_outside() {
    for (setting, inside, outside, bound) in builder_bounds() {
        assert_eq!(inside.validate(), Ok(()), "{setting}: {inside:?}");
        match outside.validate() {
            Err(Error::Config {
                variable,
                value,
                reason,
            }) => {
                assert_eq!(variable, setting);
                assert!(!value.is_empty());
                assert!(reason.contains(bound), "{setting}: {reason}");
            }
            other => panic!("{setting}: expected a config error, got {other:?}"),
        }
    }
    let huge = Config::default().cache_capacity(usize::MAX);
    let shown = huge.validate().map_err(|e| e.to_string());
    assert_eq!(
        shown,
        Err(
            "invalid value \"18446744073709551615\" for Config::cache_capacity: \
             at most 1048576 entries (kolo::config::MAX_CACHE_CAPACITY)"
                .into()
        )
    );
}

#[test]
fn the_coordinator_gets_its_part() {
    let config = Config::default()
        .cache_capacity(7)
        .stall_shutdown(Some(Duration::from_secs(3)));
    let c = config.coordinator();
    assert_eq!(c.cache_capacity, 7);
    assert_eq!(c.stall_warning, Some(Duration::from_secs(60)));
    assert_eq!(c.stall_shutdown, Some(Duration::from_secs(3)));
}

/// Raw values: mostly numbers near the bounds, some words, some bytes.
fn raw_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (
            0u64..=u64::MAX,
            prop::sample::select(vec!["", "K", "M", "G", ".5", "e3"])
        )
            .prop_map(|(n, suffix)| format!("{n}{suffix}").into_bytes()),
        prop::sample::select(vec![
            "0",
            "1",
            "60000",
            "60000.001",
            "2592000",
            "2592001",
            "1048576",
            "1048577",
            "64G",
            "65G",
            "1e-12",
            "inf",
            "NaN",
            "-0",
            "on",
            "mpi",
            "trace",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..12),
    ]
}

proptest! {
    /// Whatever the variables hold, reading them never panics, and a
    /// config read passes `validate`; an error names a variable that was
    /// set, with that variable's value.
    #[test]
    fn any_environment_reads_without_panic(
        vars in prop::collection::vec((prop::sample::select(VARIABLES.to_vec()), raw_value()), 0..6)
    ) {
        let raw: Vec<(&str, &[u8])> = vars.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        match from_raw(&raw) {
            Ok(config) => prop_assert_eq!(config.validate(), Ok(())),
            Err(Error::Config { variable, value, .. }) => {
                let set = vars.iter().rev().find(|(k, _)| *k == variable);
                prop_assert!(set.is_some(), "{} was not set", variable);
                if let Some((_, bytes)) = set {
                    prop_assert_eq!(value, String::from_utf8_lossy(bytes).into_owned());
                }
            }
            Err(other) => prop_assert!(false, "not a config error: {other:?}"),
        }
    }

    /// `validate` never panics and passes exactly the values within the
    /// bounds.
    #[test]
    fn validate_passes_exactly_the_bounded(
        threshold in any::<usize>(),
        capacity in any::<usize>(),
        cycle in any::<u64>(),
        stall in prop::option::of(any::<u64>()),
    ) {
        let config = Config::default()
            .fusion_threshold(threshold)
            .cache_capacity(capacity)
            .cycle_time(Duration::from_nanos(cycle))
            .stall_shutdown(stall.map(Duration::from_micros));
        let within = threshold <= MAX_FUSION_THRESHOLD
            && capacity <= MAX_CACHE_CAPACITY
            && Duration::from_nanos(cycle) <= MAX_CYCLE_TIME
            && stall.is_none_or(|us| us > 0 && Duration::from_micros(us) <= MAX_STALL_TIME);
        prop_assert_eq!(config.validate().is_ok(), within);
    }
}
