//! The variables a launcher hands each process — torchrun's
//! (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`), which Kubeflow's PyTorchJob, Ray Train and
//! `kolo-run` set too — each overridden by its `KOLO_` twin
//! (`KOLO_RANK`, ...), plus kolo's own `KOLO_RENDEZVOUS_TOKEN` and
//! `KOLO_RENDEZVOUS_TIMEOUT`. Parsing is a pure function of a lookup, so
//! that it is tested without touching the process's environment.

use crate::error::{RendezvousError, Result};
use std::ffi::OsString;
use std::time::Duration;

/// torchrun's default port.
pub const DEFAULT_PORT: u16 = 29500;
/// How long joining may take by default: the last process of a job may
/// start minutes after the first (a pod scheduled late).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The most processes in one job.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Where and as what this process joins its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchVars {
    /// The host of rank 0's store.
    pub master_addr: String,
    /// Its port.
    pub master_port: u16,
    /// This process's rank.
    pub rank: usize,
    /// Processes in the job.
    pub world_size: usize,
    /// This process's rank on its host.
    pub local_rank: usize,
    /// Processes on its host.
    pub local_world_size: usize,
    /// The job's token: the store serves only clients presenting it.
    pub token: Option<String>,
    /// How long joining (and each wait of the rendezvous) may take.
    pub timeout: Duration,
}

impl LaunchVars {
    /// The variables of this process's environment.
    pub fn from_env() -> Result<LaunchVars> {
        LaunchVars::from_lookup(|name| std::env::var_os(name))
    }

    /// The variables as `lookup` gives them (the environment's, or a
    /// test's).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<LaunchVars> {
        let var = |name: &str| -> Result<Option<(String, String)>> {
            let kolo = format!("KOLO_{name}");
            for variable in [kolo.as_str(), name] {
                if let Some(value) = lookup(variable) {
                    let value = value.into_string().map_err(|raw| RendezvousError::Config {
                        variable: variable.to_owned(),
                        value: raw.to_string_lossy().into_owned(),
                        reason: "not valid UTF-8".into(),
                    })?;
                    return Ok(Some((variable.to_owned(), value)));
                }
            }
            Ok(None)
        };
        let required = |name: &str| -> Result<(String, String)> {
            var(name)?.ok_or_else(|| RendezvousError::Config {
                variable: name.to_owned(),
                value: String::new(),
                reason: format!(
                    "unset (a launcher sets it: torchrun, kolo-run; or set KOLO_{name})"
                ),
            })
        };
        let number = |(variable, value): (String, String), max: usize| -> Result<usize> {
            match value.trim().parse::<usize>() {
                Ok(n) if n <= max => Ok(n),
                Ok(_) => Err(RendezvousError::Config {
                    variable,
                    value,
                    reason: format!("more than {max}"),
                }),
                Err(_) => Err(RendezvousError::Config {
                    variable,
                    value,
                    reason: "not a non-negative whole number".into(),
                }),
            }
        };
        let (_, master_addr) = required("MASTER_ADDR")?;
        if master_addr.trim().is_empty() {
            return Err(RendezvousError::Config {
                variable: "MASTER_ADDR".into(),
                value: master_addr,
                reason: "empty".into(),
            });
        }
        let master_port = match var("MASTER_PORT")? {
            None => DEFAULT_PORT,
            Some((variable, value)) => {
                let port = number((variable.clone(), value.clone()), u16::MAX as usize)?;
                // torchrun's agent serves its own store on MASTER_PORT
                // (TORCHELASTIC_USE_AGENT_STORE): kolo's listens on the
                // next port, unless KOLO_MASTER_PORT names one.
                let agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE")
                    .is_some_and(|v| v.eq_ignore_ascii_case("true"));
                let port = if agent_store && variable == "MASTER_PORT" {
                    port + 1
                } else {
                    port
                };
                u16::try_from(port).map_err(|_| RendezvousError::Config {
                    variable,
                    value,
                    reason: "not a port (torchrun's agent holds MASTER_PORT; kolo takes the next)"
                        .into(),
                })?
            }
        };
        let world_size = number(required("WORLD_SIZE")?, MAX_WORLD_SIZE)?;
        let rank_var = required("RANK")?;
        let rank = number(rank_var.clone(), MAX_WORLD_SIZE)?;
        if world_size == 0 || rank >= world_size {
            return Err(RendezvousError::Config {
                variable: rank_var.0,
                value: rank_var.1,
                reason: format!("not a rank of a world of {world_size}"),
            });
        }
        // Without the local variables the job is taken to run on one host.
        let local_world_size = match var("LOCAL_WORLD_SIZE")? {
            Some(v) => number(v, world_size)?,
            None => world_size,
        };
        let local_rank = match var("LOCAL_RANK")? {
            Some(v) => {
                let n = number(v.clone(), MAX_WORLD_SIZE)?;
                if n >= local_world_size.max(1) {
                    return Err(RendezvousError::Config {
                        variable: v.0,
                        value: v.1,
                        reason: format!("not a rank of a host of {local_world_size}"),
                    });
                }
                n
            }
            None => rank % local_world_size.max(1),
        };
        let token = match lookup("KOLO_RENDEZVOUS_TOKEN") {
            None => None,
            Some(raw) => Some(raw.into_string().map_err(|raw| RendezvousError::Config {
                variable: "KOLO_RENDEZVOUS_TOKEN".into(),
                value: raw.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".into(),
            })?),
        };
        let timeout = match var("RENDEZVOUS_TIMEOUT")? {
            None => DEFAULT_TIMEOUT,
            Some((variable, value)) => match value.trim().parse::<f64>() {
                Ok(s) if s > 0.0 && s <= MAX_TIMEOUT.as_secs_f64() => Duration::from_secs_f64(s),
                _ => {
                    return Err(RendezvousError::Config {
                        variable,
                        value,
                        reason: format!(
                            "not a number of seconds in (0, {}]",
                            MAX_TIMEOUT.as_secs()
                        ),
                    })
                }
            },
        };
        Ok(LaunchVars {
            master_addr,
            master_port,
            rank,
            world_size,
            local_rank,
            local_world_size,
            token,
            timeout,
        })
    }

    /// The store's address, `host:port` (an IPv6 host in brackets).
    pub fn store_address(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> Result<LaunchVars> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        LaunchVars::from_lookup(|name| map.get(name).cloned())
    }

    const TORCHRUN: &[(&str, &str)] = &[
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29400"),
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
    ];

    #[test]
    fn torchrun_variables_are_read() {
        let v = vars(TORCHRUN).unwrap();
        assert_eq!(
            (v.rank, v.world_size, v.local_rank, v.local_world_size),
            (5, 8, 1, 4)
        );
        assert_eq!(v.store_address(), "10.0.0.1:29400");
        assert_eq!(v.token, None);
        assert_eq!(v.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn under_torchruns_agent_store_the_next_port_is_kolos() {
        let mut pairs = TORCHRUN.to_vec();
        pairs.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        assert_eq!(vars(&pairs).unwrap().master_port, 29401);
        pairs.push(("KOLO_MASTER_PORT", "31000"));
        assert_eq!(vars(&pairs).unwrap().master_port, 31000);
    }

    #[test]
    fn kolo_variables_override_them() {
        let mut pairs = TORCHRUN.to_vec();
        pairs.extend([("KOLO_RANK", "6"), ("KOLO_RENDEZVOUS_TIMEOUT", "2.5")]);
        let v = vars(&pairs).unwrap();
        assert_eq!(v.rank, 6);
        assert_eq!(v.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn defaults_fill_the_optional_ones() {
        let v = vars(&[("MASTER_ADDR", "::1"), ("RANK", "2"), ("WORLD_SIZE", "3")]).unwrap();
        assert_eq!(v.master_port, DEFAULT_PORT);
        assert_eq!((v.local_rank, v.local_world_size), (2, 3));
        assert_eq!(v.store_address(), "[::1]:29500");
    }

    #[test]
    fn bad_values_name_the_variable_and_the_value() {
        let err = vars(&[("MASTER_ADDR", "h"), ("RANK", "3"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("RANK=\"3\": not a rank of a world of 2"),
            "{err}"
        );
        let err = vars(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
        let err = vars(&[
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "70000"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("MASTER_PORT=\"70000\""), "{err}");
        let err = vars(&[("MASTER_ADDR", "h"), ("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(
            err.to_string().contains("not a non-negative whole number"),
            "{err}"
        );
        let err = vars(&[
            ("MASTER_ADDR", "h"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("KOLO_RENDEZVOUS_TIMEOUT", "0"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("KOLO_RENDEZVOUS_TIMEOUT"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_utf8_is_an_error_naming_it() {
        use std::os::unix::ffi::OsStringExt;
        let raw = OsString::from_vec(vec![b'1', 0xff]);
        let err = LaunchVars::from_lookup(|name| match name {
            "MASTER_ADDR" => Some("h".into()),
            "WORLD_SIZE" => Some("2".into()),
            "RANK" => Some(raw.clone()),
            _ => None,
        })
        .unwrap_err();
        assert!(err.to_string().contains("RANK"), "{err}");
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
    }
}
