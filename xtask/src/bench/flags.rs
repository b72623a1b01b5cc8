//! The options of one sweep: `--name value`, `--name=value` and switches,
//! checked against the sweep's list, which also prints its help.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::str::FromStr;

/// One option a sweep accepts.
pub(crate) struct Flag {
    /// `--reps`.
    pub name: &'static str,
    /// What the value is (`N`, `PATH`), or `None` for a switch.
    pub value: Option<&'static str>,
    /// One line of help, with the default where there is one.
    pub help: &'static str,
}

/// `--out DIR`, which every sweep accepts.
pub(crate) const OUT: Flag = Flag {
    name: "--out",
    value: Some("DIR"),
    help: "write the raw output here (default: target/bench/<sweep>/)",
};

/// `--no-rt`, for the sweeps that run under SCHED_FIFO when allowed.
pub(crate) const NO_RT: Flag = Flag {
    name: "--no-rt",
    value: None,
    help: "run under the normal scheduler, not `chrt -f 10`",
};

/// The options given to a sweep.
pub(crate) struct Flags {
    sweep: &'static str,
    values: Vec<(&'static str, String)>,
    switches: Vec<&'static str>,
}

impl Flags {
    /// Parses `args` for the sweep `sweep`, whose options are `known`; an
    /// unknown option, a missing value or a stray argument is an error
    /// naming it.
    pub(crate) fn parse(sweep: &'static str, args: &[String], known: &[Flag]) -> Result<Flags> {
        let mut flags = Flags {
            sweep,
            values: Vec::new(),
            switches: Vec::new(),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (arg.as_str(), None),
            };
            let Some(flag) = known.iter().find(|f| f.name == name) else {
                bail!(
                    "`cargo xtask bench {sweep}`: unknown argument {arg:?} \
                     (`cargo xtask bench {sweep} --help` lists the options)"
                );
            };
            match (flag.value, inline) {
                (None, None) => flags.switches.push(flag.name),
                (None, Some(_)) => bail!("`{}` takes no value (in {arg:?})", flag.name),
                (Some(_), Some(value)) => flags.values.push((flag.name, value)),
                (Some(what), None) => {
                    let value = args
                        .next()
                        .with_context(|| format!("`{}` needs a value ({what})", flag.name))?;
                    flags.values.push((flag.name, value.clone()));
                }
            }
        }
        Ok(flags)
    }

    /// The last value given for `name`, if any.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name` parsed as `T`, or `default` when not given.
    pub(crate) fn value<T: FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.text(name) {
            None => Ok(default),
            Some(text) => text.parse().map_err(|_| {
                anyhow::anyhow!(
                    "`cargo xtask bench {}`: {name} {text:?} is not a valid {}",
                    self.sweep,
                    std::any::type_name::<T>()
                )
            }),
        }
    }

    /// A count that must be at least 1 (repetitions, rounds, iterations).
    pub(crate) fn count(&self, name: &str, default: usize) -> Result<usize> {
        let n = self.value(name, default)?;
        if n == 0 {
            bail!(
                "`cargo xtask bench {}`: {name} must be at least 1",
                self.sweep
            );
        }
        Ok(n)
    }

    /// A path option.
    pub(crate) fn path(&self, name: &str) -> Option<PathBuf> {
        self.text(name).map(PathBuf::from)
    }

    /// Whether the switch `name` was given.
    pub(crate) fn switch(&self, name: &str) -> bool {
        self.switches.contains(&name)
    }
}

/// The help lines of `flags`, aligned.
pub(crate) fn help(flags: &[Flag]) -> String {
    let left = |f: &Flag| match f.value {
        Some(v) => format!("{} {v}", f.name),
        None => f.name.to_string(),
    };
    let width = flags.iter().map(|f| left(f).len()).max().unwrap_or(0);
    flags
        .iter()
        .map(|f| format!("  {:width$}  {}", left(f), f.help))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[Flag] = &[
        Flag {
            name: "--reps",
            value: Some("N"),
            help: "repetitions",
        },
        NO_RT,
        OUT,
    ];

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn values_switches_and_defaults() {
        let flags = Flags::parse(
            "engine",
            &args(&["--reps", "4", "--no-rt", "--out=/x"]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(flags.count("--reps", 3).unwrap(), 4);
        assert!(flags.switch("--no-rt"));
        assert_eq!(flags.path("--out"), Some(PathBuf::from("/x")));
        let none = Flags::parse("engine", &[], KNOWN).unwrap();
        assert_eq!(none.count("--reps", 3).unwrap(), 3);
        assert!(!none.switch("--no-rt"));
        assert_eq!(none.path("--out"), None);
    }

    #[test]
    fn bad_input_names_the_option() {
        let err = |list: &[&str]| match Flags::parse("engine", &args(list), KNOWN) {
            Ok(flags) => flags.count("--reps", 3).unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err(&["--rep", "4"]).contains("unknown argument \"--rep\""));
        assert!(err(&["--reps"]).contains("`--reps` needs a value (N)"));
        assert!(err(&["--no-rt=1"]).contains("`--no-rt` takes no value"));
        assert!(err(&["--reps", "x"]).contains("--reps \"x\" is not a valid usize"));
        assert!(err(&["--reps", "0"]).contains("--reps must be at least 1"));
    }

    #[test]
    fn help_aligns_the_options() {
        let text = help(KNOWN);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("  --reps N   "), "{text}");
        assert_eq!(lines[0].find("repetitions"), lines[2].find("write"));
    }
}
