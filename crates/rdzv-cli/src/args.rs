//! Checks of command-line values, applied by clap before anything connects, so that a bad
//! flag is a usage error (exit 2) naming the flag.

use std::time::Duration;

use rdzv::ConfigError;
use rdzv_core::ids::validate_id;
use rdzv_core::params::parse_duration;

/// `--run-id`: the identifier rule of `rdzv_core::ids` (ASCII letters, digits, `-` `_` `.`
/// `:` `@` `+`; 1 to 253 characters).
pub fn run_id(value: &str) -> Result<String, String> {
    validate_id("--run-id", value).map_err(|e| reason(&e))?;
    Ok(value.to_string())
}

/// `--node-id`: the same rule as run ids.
pub fn node_id(value: &str) -> Result<String, String> {
    validate_id("--node-id", value).map_err(|e| reason(&e))?;
    Ok(value.to_string())
}

/// `--role`: the same rule as run ids (it names the workers' role in `ROLE_NAME`).
pub fn role(value: &str) -> Result<String, String> {
    validate_id("--role", value).map_err(|e| reason(&e))?;
    Ok(value.to_string())
}

/// A duration flag: seconds (`30`, `0.5`) or a humane form (`30s`, `10m`, `2h`), at most a
/// year (longer deadlines would overflow the clock).
pub fn duration(value: &str) -> Result<Duration, String> {
    parse_duration("duration", value).map_err(|e| reason(&e))
}

/// A duration flag that must not be zero (a period).
pub fn positive_duration(value: &str) -> Result<Duration, String> {
    let d = duration(value)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

/// A `--segment`: a label by the identifier rule, `auto`, or empty for none (the agent
/// gives its workers an empty `RDZV_SEGMENT` without one, and job scripts write
/// `RDZV_SEGMENT=${RACK:-}`).
pub fn segment(value: &str) -> Result<String, String> {
    if !value.is_empty() {
        rdzv_core::ids::validate_id("segment", value).map_err(|e| reason(&e))?;
    }
    Ok(value.to_string())
}

/// A `--health-check`: a shell command, `builtin:` checks that exist, or empty for none (an
/// empty `RDZV_HEALTH_CHECK`, as job scripts write `RDZV_HEALTH_CHECK=${CHECK:-}`).
pub fn health_check(value: &str) -> Result<String, String> {
    if !value.is_empty() {
        rdzv::health::Checks::parse(&[value.to_string()], Duration::from_secs(1)).map_err(|e| reason(&e))?;
    }
    Ok(value.to_string())
}

/// The part of a configuration error that clap does not already say (clap names the flag
/// and the value itself).
fn reason(e: &ConfigError) -> String {
    match e {
        ConfigError::InvalidValue { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_rule() {
        assert_eq!(run_id("12345678").as_deref(), Ok("12345678"));
        assert!(run_id("a/rdzv/v_1/join/x").is_err_and(|e| e.contains('/')));
        assert!(node_id("").is_err_and(|e| e.contains("empty")));
        assert!(node_id("a\tb").is_err_and(|e| e.contains("whitespace")));
    }

    #[test]
    fn an_empty_segment_or_health_check_is_none_and_others_follow_the_rule() {
        assert_eq!(segment("").as_deref(), Ok(""));
        assert_eq!(segment("rack-7").as_deref(), Ok("rack-7"));
        assert!(segment("rack 7").is_err_and(|e| e.contains("whitespace")));
        assert_eq!(health_check("").as_deref(), Ok(""));
        assert!(health_check("builtin:nope").is_err());
    }

    #[test]
    fn durations_are_bounded() {
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("10m"), Ok(Duration::from_secs(600)));
        assert!(duration("18446744073709551615s").is_err_and(|e| e.contains("too long")));
        assert!(duration("2y").is_err_and(|e| e.contains("too long")));
        assert!(positive_duration("0").is_err());
        assert_eq!(positive_duration("500ms"), Ok(Duration::from_millis(500)));
    }
}
