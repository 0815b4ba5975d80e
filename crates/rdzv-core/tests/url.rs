//! The rules of rendezvous URLs (docs/OPTIONS.md) and of the parameters they carry
//! (docs/PROTOCOL.md "Parameters"): each rule holds, and each kind of bad input is one clear
//! error, never a panic. The URL parser knows no backend: hosts without a port get port 0
//! here, or the port given to `parse_with_default_port`; the built-in backends' own rules
//! (default ports, etcd's `protocol`, Redis's database-like paths) are tested next to their
//! factories, the registry's applying them in `tests/registry.rs`.

use std::time::Duration;

use rdzv_core::params::{DEFAULT_PREFIX, parse_duration};
use rdzv_core::url::Endpoint;
use rdzv_core::url::parse_endpoint;
use rdzv_core::{ConfigError, RendezvousUrl};

fn parse(url: &str) -> RendezvousUrl {
    RendezvousUrl::parse(url).unwrap_or_else(|e| panic!("`{url}` should parse: {e}"))
}

fn parse_err(url: &str) -> ConfigError {
    match RendezvousUrl::parse(url) {
        Ok(parsed) => panic!("`{url}` should not parse, got {parsed:?}"),
        Err(e) => e,
    }
}

fn ep(host: &str, port: u16) -> Endpoint {
    Endpoint { host: host.into(), port }
}

// The reference's own example works as is.
#[test]
fn reference_url() {
    let url = parse("etcd://localhost:2379/1234?min_workers=1&max_workers=3");
    assert_eq!(url.scheme, "etcd");
    assert_eq!(url.endpoints, vec![ep("localhost", 2379)]);
    assert_eq!(url.run_id, "1234");
    assert_eq!(url.username, None);
    assert!(url.password.is_none());
    assert_eq!(url.rendezvous_options.len(), 2);
    assert!(url.options.is_empty());
    let params = url.params().expect("valid parameters");
    assert_eq!((params.min_workers, params.max_workers), (1, 3));
    assert_eq!(params.run_id, "1234");
}

#[test]
fn no_scheme_has_a_default_port_of_its_own() {
    for url in ["etcd://h/r", "etcds://h/r", "redis://h/r?db=0", "mem://h/r", "custom://h/r"] {
        assert_eq!(parse(url).endpoints, vec![ep("h", 0)], "{url}");
    }
}

#[test]
fn default_port_from_argument() {
    let url = RendezvousUrl::parse_with_default_port("custom://h/r", Some(4242)).expect("valid");
    assert_eq!(url.endpoints, vec![ep("h", 4242)]);
    let url = RendezvousUrl::parse_with_default_port("custom://h:1/r", Some(4242)).expect("valid");
    assert_eq!(url.endpoints, vec![ep("h", 1)]);
    let url =
        RendezvousUrl::parse_with_default_port("etcd://h1:1,h2/r?endpoints=h3", Some(2379)).expect("valid");
    assert_eq!(url.endpoints, vec![ep("h1", 1), ep("h2", 2379), ep("h3", 2379)], "`endpoints=` too");
}

#[test]
fn scheme_is_lower_cased() {
    assert_eq!(parse("ETCD://h/r").scheme, "etcd");
    assert_eq!(parse("My-Scheme+x.1://h/r").scheme, "my-scheme+x.1");
}

#[test]
fn surrounding_whitespace_is_ignored() {
    assert_eq!(parse("  etcd://h/r?min_workers=1\n").run_id, "r");
}

#[test]
fn credentials_are_percent_decoded() {
    let url = parse("etcd://us%40er:p%3Ass%2Fw%25rd@h:1/r");
    assert_eq!(url.username.as_deref(), Some("us@er"));
    assert_eq!(url.password.as_ref().map(|p| p.expose()), Some("p:ss/w%rd"));
    assert_eq!(url.endpoints, vec![ep("h", 1)]);
    // A password may hold `:` and `@` unencoded: the user ends at the first `:`, the
    // credentials at the last `@`.
    let url = parse("etcd://u:a:b@c@h/r");
    assert_eq!(url.username.as_deref(), Some("u"));
    assert_eq!(url.password.as_ref().map(|p| p.expose()), Some("a:b@c"));
}

#[test]
fn password_only_and_user_only() {
    let url = parse("redis://:secret@h/r");
    assert_eq!(url.username, None);
    assert_eq!(url.password.as_ref().map(|p| p.expose()), Some("secret"));
    let url = parse("redis://alice@h/r");
    assert_eq!(url.username.as_deref(), Some("alice"));
    assert!(url.password.is_none());
}

#[test]
fn several_endpoints() {
    let url = parse("etcd://h1:1,h2,[::1]:3/r?endpoints=h4:4,h5,h1:1");
    assert_eq!(url.endpoints, vec![ep("h1", 1), ep("h2", 0), ep("::1", 3), ep("h4", 4), ep("h5", 0)]);
    assert!(!url.options.contains_key("endpoints"), "endpoints is consumed");
}

#[test]
fn ipv6_in_brackets() {
    let url = parse("etcd://[::1]:2380/r");
    assert_eq!(url.endpoints, vec![ep("::1", 2380)]);
    let url = parse("etcd://[2001:db8::1]/r");
    assert_eq!(url.endpoints, vec![ep("2001:db8::1", 0)]);
}

#[test]
fn run_id_is_one_decoded_segment() {
    assert_eq!(parse("etcd://h/job%2D1").run_id, "job-1");
    assert_eq!(parse("etcd://h/12345_7+0:a@b").run_id, "12345_7+0:a@b");
    assert_eq!(parse("etcd://h/job-1/").run_id, "job-1", "one trailing slash is fine");
    assert_eq!(parse("mem://local/r?min_workers=2").endpoints, vec![ep("local", 0)]);
}

#[test]
fn options_split_into_rendezvous_and_backend() {
    let url = parse(
        "etcds://h/r?min_nodes=2&max_nodes=4&etcd_prefix=/p&timeout=5&last_call_timeout=1s\
         &keep_alive_ttl=2m&run_ttl=1h&node_id=n1&local_addr=10.0.0.1&cacert=ca.pem&db=3",
    );
    let names: Vec<&str> = url.rendezvous_options.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "keep_alive_ttl",
            "last_call_timeout",
            "local_addr",
            "max_workers",
            "min_workers",
            "node_id",
            "prefix",
            "run_ttl",
            "timeout"
        ]
    );
    let backend: Vec<&str> = url.options.keys().map(String::as_str).collect();
    assert_eq!(backend, ["cacert", "db"]);
    let p = url.params().expect("valid");
    assert_eq!((p.min_workers, p.max_workers), (2, 4));
    assert_eq!(p.prefix, "/p");
    assert_eq!(p.timeout, Duration::from_secs(5));
    assert_eq!(p.last_call_timeout, Duration::from_secs(1));
    assert_eq!(p.keep_alive_ttl, Duration::from_secs(120));
    assert_eq!(p.run_ttl, Duration::from_secs(3600));
    assert_eq!(p.node_id.as_deref(), Some("n1"));
    assert_eq!(p.local_addr.as_deref(), Some("10.0.0.1"));
}

#[test]
fn option_values_are_percent_decoded_and_plus_is_a_plus() {
    let url = parse("etcd://h/r?node_id=a%26b%3Dc+d");
    assert_eq!(url.rendezvous_options["node_id"], "a&b=c+d");
}

#[test]
fn empty_query_segments_are_skipped() {
    let url = parse("etcd://h/r?&min_workers=1&&");
    assert_eq!(url.rendezvous_options["min_workers"], "1");
    assert!(parse("etcd://h/r?").rendezvous_options.is_empty());
}

#[test]
fn scheme_specific_options_are_left_to_the_backend() {
    // etcd's `protocol` is the etcd factory's to interpret (crates/rdzv-etcd/src/factory.rs):
    // the parser keeps it as an ordinary option, on every scheme.
    for url in ["etcd://h/r?protocol=https", "etcds://h/r?protocol=ftp", "redis://h/r?protocol=https"] {
        let parsed = parse(url);
        assert_eq!(parsed.scheme, url.split_once(':').expect("a scheme").0, "{url}");
        assert!(parsed.options.contains_key("protocol"), "{url}");
    }
}

#[test]
fn parameter_defaults() {
    let p = parse("etcd://h/r?min_workers=3").params().expect("valid");
    assert_eq!((p.min_workers, p.max_workers), (3, 3));
    assert_eq!(p.timeout, Duration::from_secs(600));
    assert_eq!(p.last_call_timeout, Duration::from_secs(30));
    assert_eq!(p.prefix, DEFAULT_PREFIX);
    assert_eq!(p.keep_alive_ttl, Duration::from_secs(10));
    assert_eq!(p.run_ttl, Duration::from_secs(7200));
    assert_eq!(p.node_id, None);
    assert_eq!(p.local_addr, None);
}

/// A run's default session TTL grows with `max_workers` (bounding the refreshes the server
/// serves), never past half an explicit `run_ttl`; one that is given is kept as given.
#[test]
fn the_default_keep_alive_ttl_grows_with_the_run() {
    let ttl = |query: &str| {
        let p = parse(&format!("etcd://h/r?{query}")).params().expect("valid");
        (p.keep_alive_ttl.as_secs(), p.validate().is_ok())
    };
    assert_eq!(ttl("min_workers=1&max_workers=4095"), (10, true));
    assert_eq!(ttl("min_workers=1&max_workers=4096"), (11, true));
    assert_eq!(ttl("min_workers=8192"), (12, true), "max_workers defaults to min_workers");
    assert_eq!(ttl("min_workers=1&max_workers=98304"), (34, true));
    assert_eq!(ttl("min_workers=1&max_workers=98304&keep_alive_ttl=10s"), (10, true));
    assert_eq!(ttl("min_workers=1&max_workers=98304&run_ttl=40s"), (20, true), "half the run_ttl");
    assert_eq!(ttl("min_workers=1&max_workers=98304&run_ttl=1m"), (30, true));
    let p = rdzv_core::RendezvousParams::new("r", 1, 98_304).expect("valid sizes");
    assert_eq!(p.keep_alive_ttl, Duration::from_secs(34), "the same default without a URL");
    // Below twice the base, the run_ttl is refused as before, naming the base it must double.
    match params_err("etcd://h/r?min_workers=1&max_workers=98304&run_ttl=15s") {
        ConfigError::InvalidValue { option, reason, .. } => {
            assert_eq!(option, "run_ttl");
            assert!(reason.contains("twice keep_alive_ttl (10s)"), "{reason}");
        }
        other => panic!("expected InvalidValue for run_ttl, got {other:?}"),
    }
}

#[test]
fn durations() {
    for (text, expected) in [
        ("30", Duration::from_secs(30)),
        ("0.5", Duration::from_millis(500)),
        ("30s", Duration::from_secs(30)),
        ("2m", Duration::from_secs(120)),
        ("1h", Duration::from_secs(3600)),
        ("500ms", Duration::from_millis(500)),
        ("1h 30m", Duration::from_secs(5400)),
        ("0", Duration::ZERO),
    ] {
        assert_eq!(parse_duration("timeout", text), Ok(expected), "{text}");
    }
    let year = Duration::from_secs(365 * 24 * 3600);
    assert_eq!(rdzv_core::params::MAX_DURATION, year);
    assert_eq!(parse_duration("run_ttl", "365d"), Ok(year));
    assert_eq!(parse_duration("run_ttl", "31536000"), Ok(year));
    for bad in ["", "-1", "abc", "1.2.3", ".", "1e3", "inf", "NaN", "30 parsecs", "99999999999999999999999"] {
        assert!(
            matches!(parse_duration("timeout", bad), Err(ConfigError::InvalidValue { .. })),
            "{bad:?} should be rejected"
        );
    }
}

fn params_err(url: &str) -> ConfigError {
    match parse(url).params() {
        Ok(p) => panic!("`{url}` should have bad parameters, got {p:?}"),
        Err(e) => e,
    }
}

#[test]
fn parameter_errors() {
    assert_eq!(params_err("etcd://h/r"), ConfigError::MissingOption("min_workers".into()));
    assert_eq!(params_err("etcd://h/r?max_workers=3"), ConfigError::MissingOption("min_workers".into()));
    for (url, option) in [
        ("etcd://h/r?min_workers=0", "min_workers"),
        ("etcd://h/r?min_workers=-1", "min_workers"),
        ("etcd://h/r?min_workers=two", "min_workers"),
        ("etcd://h/r?min_workers=1.5", "min_workers"),
        ("etcd://h/r?min_workers=99999999999999999999999999", "min_workers"),
        ("etcd://h/r?min_workers=3&max_workers=2", "max_workers"),
        ("etcd://h/r?min_workers=1&max_workers=x", "max_workers"),
        ("etcd://h/r?min_workers=1&timeout=soon", "timeout"),
        ("etcd://h/r?min_workers=1&timeout=0", "timeout"),
        ("etcd://h/r?min_workers=1&keep_alive_ttl=0s", "keep_alive_ttl"),
        ("etcd://h/r?min_workers=1&run_ttl=0", "run_ttl"),
        ("etcd://h/r?min_workers=1&last_call_timeout=-5s", "last_call_timeout"),
        ("etcd://h/r?min_workers=1&keep_alive_ttl=10s&run_ttl=15s", "run_ttl"),
        ("etcd://h/r?min_workers=1&keep_alive_ttl=3h", "run_ttl"),
    ] {
        match params_err(url) {
            ConfigError::InvalidValue { option: o, reason, .. } => {
                assert_eq!(o, option, "{url}");
                assert!(!reason.is_empty());
            }
            other => panic!("{url}: expected InvalidValue for {option}, got {other:?}"),
        }
    }
}

/// A run lease shorter than twice the session TTL is refused, saying why and naming both.
#[test]
fn a_run_ttl_under_twice_the_keep_alive_ttl_is_refused() {
    match params_err("etcd://h/r?min_workers=1&keep_alive_ttl=10s&run_ttl=15s") {
        ConfigError::InvalidValue { option, value, reason } => {
            assert_eq!((option.as_str(), value.as_str()), ("run_ttl", "15s"));
            assert!(reason.contains("twice keep_alive_ttl (10s)"), "{reason}");
        }
        other => panic!("expected InvalidValue for run_ttl, got {other:?}"),
    }
    let mut p = rdzv_core::RendezvousParams::new("r", 1, 1).expect("valid sizes");
    p.keep_alive_ttl = Duration::from_secs(2);
    p.run_ttl = Duration::from_secs(4);
    assert!(p.validate().is_ok(), "exactly twice is enough");
}

#[test]
fn parameters_from_options_reject_unknown_and_doubled() {
    use std::collections::BTreeMap;
    let mut options = BTreeMap::new();
    options.insert("min_workers".to_string(), "1".to_string());
    options.insert("min_nodes".to_string(), "2".to_string());
    assert!(matches!(
        rdzv_core::RendezvousParams::from_options("r", &options),
        Err(ConfigError::InvalidUrl(_))
    ));
    let mut options = BTreeMap::new();
    options.insert("min_workers".to_string(), "1".to_string());
    options.insert("colour".to_string(), "blue".to_string());
    assert!(matches!(
        rdzv_core::RendezvousParams::from_options("r", &options),
        Err(ConfigError::UnknownOption { option, .. }) if option == "colour"
    ));
}

/// The parameters of run `r` with `min_workers=1` and these options.
fn params(pairs: &[(&str, &str)]) -> Result<rdzv_core::RendezvousParams, ConfigError> {
    let options: std::collections::BTreeMap<String, String> =
        [("min_workers", "1")].iter().chain(pairs).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    rdzv_core::RendezvousParams::from_options("r", &options)
}

/// The segment option and the rank orders that follow it: `segment` by default, both
/// spellings of `segment+natural` (torchrun splits `--rdzv-conf` at commas), a label by the
/// identifier rule.
#[test]
fn segment_and_rank_order_options() {
    use rdzv_core::params::RankOrder;
    let default = params(&[]).expect("defaults");
    assert_eq!((default.segment, default.rank_order), (None, RankOrder::Segment));
    let labelled = params(&[("segment", "rack-7"), ("rank_order", "segment+natural")]).expect("labelled");
    assert_eq!(
        (labelled.segment.as_deref(), labelled.rank_order),
        (Some("rack-7"), RankOrder::SegmentNatural)
    );
    for (value, order) in [
        ("segment,natural", RankOrder::SegmentNatural),
        ("segment", RankOrder::Segment),
        ("arrival", RankOrder::Arrival),
        ("natural", RankOrder::Natural),
        ("slurm", RankOrder::Slurm),
    ] {
        assert_eq!(params(&[("rank_order", value)]).expect(value).rank_order, order);
    }
    for (pairs, option) in [
        (&[("segment", "rack 7")][..], "segment"),
        (&[("segment", "")], "segment"),
        (&[("segment", "a/b")], "segment"),
        (&[("rank_order", "racks")], "rank_order"),
    ] {
        match params(pairs) {
            Err(ConfigError::InvalidValue { option: o, .. }) => assert_eq!(o, option, "{pairs:?}"),
            other => panic!("{pairs:?}: expected an invalid {option}, got {other:?}"),
        }
    }
}

/// `node_index`: a whole number, 0 or more, what `rank_order=slurm` orders by.
#[test]
fn node_index_option() {
    assert_eq!(params(&[]).expect("defaults").node_index, None);
    assert_eq!(params(&[("node_index", "0")]).expect("index 0").node_index, Some(0));
    assert_eq!(
        params(&[("node_index", "1023"), ("rank_order", "slurm")]).expect("1023").node_index,
        Some(1023)
    );
    for value in ["-1", "", "x", "1.5", "99999999999999999999"] {
        match params(&[("node_index", value)]) {
            Err(ConfigError::InvalidValue { option, reason, .. }) => {
                assert_eq!(option, "node_index", "{value:?}");
                assert!(reason.contains("whole number"), "{value:?}: {reason}");
            }
            other => panic!("{value:?}: expected an invalid node_index, got {other:?}"),
        }
    }
}

/// `segment_size`: whole segments of K need a segment, a rank order by segment, and sizes that
/// are multiples of K; each broken rule names its option.
#[test]
fn segment_size_option() {
    let whole = [("min_workers", "4"), ("max_workers", "8"), ("segment", "nvl1"), ("segment_size", "2")];
    assert_eq!(params(&whole).expect("whole segments").segment_size, Some(2));
    assert_eq!(params(&[]).expect("defaults").segment_size, None);
    let with = |changes: &[(&'static str, &'static str)]| {
        let mut pairs: std::collections::BTreeMap<&str, &str> = whole.into_iter().collect();
        pairs.extend(changes.iter().copied());
        pairs.retain(|_, v| !v.is_empty());
        params(&pairs.into_iter().collect::<Vec<_>>())
    };
    for (changes, option, says) in [
        (&[("segment_size", "0")][..], "segment_size", "at least one"),
        (&[("segment_size", "two")], "segment_size", "whole number"),
        (&[("min_workers", "3")], "min_workers", "multiple of segment_size (2)"),
        (&[("max_workers", "9")], "max_workers", "multiple of segment_size (2)"),
        (&[("rank_order", "arrival")], "rank_order", "`segment` or `segment+natural`"),
    ] {
        match with(changes) {
            Err(ConfigError::InvalidValue { option: o, reason, .. }) => {
                assert_eq!(o, option, "{changes:?}");
                assert!(reason.contains(says), "{changes:?}: {reason}");
            }
            other => panic!("{changes:?}: expected an invalid {option}, got {other:?}"),
        }
    }
    // A worker names its segment; a reader of the run (`rdzv status`) need not.
    let unnamed = with(&[("segment", "")]).expect("a reader's options");
    match unnamed.validate_worker() {
        Err(ConfigError::InvalidValue { option, reason, .. }) => {
            assert_eq!(option, "segment");
            assert!(reason.contains("needs this worker's segment"), "{reason}");
        }
        other => panic!("expected an invalid segment, got {other:?}"),
    }
}

/// The health gate's options: the check with its defaults, each value checked, and the
/// timing options refused without a check (they would do nothing).
#[test]
fn health_check_options() {
    assert_eq!(params(&[]).expect("no gate").health, None);
    let health =
        params(&[("health_check", "builtin:gpu+disk:/tmp:10G")]).expect("a gate").health.expect("some");
    assert_eq!(health, rdzv_core::params::HealthParams::new("builtin:gpu+disk:/tmp:10G"));
    assert_eq!(
        (health.timeout, health.interval, health.failures, health.gpus),
        (Duration::from_secs(60), Duration::from_secs(30), 2, 1)
    );
    let tuned = params(&[
        ("health_check", "test -e /ok"),
        ("health_check_timeout", "5s"),
        ("health_check_interval", "2"),
        ("health_check_failures", "3"),
    ])
    .expect("tuned")
    .health
    .expect("some");
    assert_eq!(
        (tuned.timeout, tuned.interval, tuned.failures),
        (Duration::from_secs(5), Duration::from_secs(2), 3)
    );
    for (pairs, option) in [
        (&[("health_check_interval", "5s")][..], "health_check_interval"),
        (&[("health_check", "x"), ("health_check_failures", "0")], "health_check_failures"),
        (&[("health_check", "x"), ("health_check_failures", "two")], "health_check_failures"),
        (&[("health_check", "x"), ("health_check_timeout", "0")], "health_check_timeout"),
        (&[("health_check", "x"), ("health_check_interval", "soon")], "health_check_interval"),
        (&[("health_check", " ")], "health_check"),
    ] {
        match params(pairs) {
            Err(ConfigError::InvalidValue { option: o, .. }) => assert_eq!(o, option, "{pairs:?}"),
            other => panic!("{pairs:?}: expected an invalid {option}, got {other:?}"),
        }
    }
}

#[test]
fn syntax_errors() {
    for url in [
        "",
        "   ",
        "localhost:2379/r",
        "etcd:/h/r",
        "://h/r",
        "1etcd://h/r",
        "et_cd://h/r",
        "etcd://h/r#frag",
        "etcd://h/r?min_workers",
        "etcd://h/r?=3",
        "etcd://h/r?a%zz=1",
    ] {
        assert!(matches!(parse_err(url), ConfigError::InvalidUrl(_)), "{url:?}");
    }
}

#[test]
fn run_id_errors() {
    for url in ["etcd://h", "etcd://h/", "etcd://h//", "etcd://h?min_workers=1", "mem://x/"] {
        assert!(matches!(parse_err(url), ConfigError::InvalidUrl(_)), "{url:?}");
    }
    for url in [
        "etcd://h/a/b",
        "etcd://h/a%2Fb",
        "etcd://h/a%00b",
        "etcd://h/%zz",
        "etcd://h/%FF",
        "etcd://h/job%201",
        "etcd://h/a%1B%5B31m",
        "etcd://h/caf%C3%A9",
        "etcd://h/a%25b",
    ] {
        assert!(
            matches!(parse_err(url), ConfigError::InvalidValue { option, .. } if option == "run_id"),
            "{url:?}"
        );
    }
}

#[test]
fn option_errors() {
    assert!(matches!(
        parse_err("etcd://h/r?min_workers="),
        ConfigError::InvalidValue { option, .. } if option == "min_workers"
    ));
    assert!(matches!(
        parse_err("etcd://h/r?db=%"),
        ConfigError::InvalidValue { option, .. } if option == "db"
    ));
    for url in [
        "etcd://h/r?min_workers=1&min_workers=2",
        "etcd://h/r?min_workers=1&min_nodes=2",
        "etcd://h/r?etcd_prefix=/a&prefix=/b",
        "etcd://h/r?db=1&db=1",
        "etcd://h/r?endpoints=a&endpoints=b",
        "etcd://h/r?protocol=https&protocol=https",
        "etcd://h/r?password_file=a&password_file=b",
    ] {
        let err = parse_err(url);
        assert!(
            matches!(err, ConfigError::InvalidUrl(ref m) if m.contains("more than once")),
            "{url}: {err}"
        );
    }
    assert!(matches!(
        parse_err("etcd://h/r?endpoints=h2:99999"),
        ConfigError::InvalidValue { option, .. } if option == "port"
    ));
    assert!(matches!(
        parse_err("etcd://h/r?endpoints=h2,,h3"),
        ConfigError::InvalidValue { option, .. } if option == "host"
    ));
}

#[test]
fn host_errors_in_urls() {
    for url in [
        "etcd://exa mple/r",
        "etcd://-bad-/r",
        "etcd://bad-/r",
        "etcd://a..b/r",
        "etcd://.a/r",
        "etcd:///r",
        "etcd://:2379/r",
        "etcd://h1,,h2/r",
        "etcd://h1,/r",
        "etcd://user:pw@/r",
        "etcd://::1/r",
        "etcd://[::1/r",
        "etcd://[::g]/r",
        "etcd://[::1]x/r",
        "etcd://256.1.1.1/r",
        "etcd://h%41/r",
        "etcd://ex~ample/r",
    ] {
        let err = parse_err(url);
        assert!(
            matches!(err, ConfigError::InvalidValue { ref option, .. } if option == "host"),
            "{url:?}: {err:?}"
        );
    }
    let long_label = "a".repeat(64);
    assert!(matches!(parse_err(&format!("etcd://{long_label}/r")), ConfigError::InvalidValue { .. }));
    let long_host = vec!["a".repeat(60); 5].join(".");
    assert!(matches!(parse_err(&format!("etcd://{long_host}/r")), ConfigError::InvalidValue { .. }));
}

#[test]
fn port_errors_in_urls() {
    for url in [
        "etcd://h:/r",
        "etcd://h:65536/r",
        "etcd://h:70000/r",
        "etcd://h:99999999999999999999/r",
        "etcd://h:-1/r",
        "etcd://h:+1/r",
        "etcd://h:abc/r",
        "etcd://h: 1/r",
        "etcd://[::1]:/r",
        "etcd://[::1]:65536/r",
    ] {
        let err = parse_err(url);
        assert!(
            matches!(err, ConfigError::InvalidValue { ref option, .. } if option == "port"),
            "{url:?}: {err:?}"
        );
    }
    assert_eq!(parse("etcd://h:0/r").endpoints, vec![ep("h", 0)]);
    assert_eq!(parse("etcd://h:65535/r").endpoints, vec![ep("h", 65535)]);
}

// The cases of the reference's `parse_rendezvous_endpoint` tests.
mod reference_endpoint_cases {
    use super::*;

    #[test]
    fn returns_host_and_port() {
        for text in [
            "dummy.com:0",
            "dummy.com:123",
            "dummy.com:65535",
            "dummy-1.com:0",
            "dummy-1.com:123",
            "dummy-1.com:65535",
            "123.123.123.123:0",
            "123.123.123.123:123",
            "123.123.123.123:65535",
            "[2001:db8::1]:0",
            "[2001:db8::1]:123",
            "[2001:db8::1]:65535",
        ] {
            let (host, port) = text.rsplit_once(':').expect("has a port");
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port: u16 = port.parse().expect("a port");
            assert_eq!(parse_endpoint(text, Some(123)), Ok(ep(host, port)), "{text}");
        }
    }

    #[test]
    fn default_port_when_none_given() {
        for (text, host) in [
            ("dummy.com", "dummy.com"),
            ("dummy-1.com", "dummy-1.com"),
            ("dummy_1.com", "dummy_1.com"),
            ("123.123.123.123", "123.123.123.123"),
            ("[2001:db8::1]", "2001:db8::1"),
        ] {
            assert_eq!(parse_endpoint(text, Some(123)), Ok(ep(host, 123)), "{text}");
        }
    }

    #[test]
    fn empty_host_is_an_error_here() {
        // The reference maps an empty endpoint to localhost; a URL must name its host.
        for text in ["", "  "] {
            assert!(matches!(parse_endpoint(text, Some(123)), Err(ConfigError::InvalidValue { .. })));
        }
    }

    #[test]
    fn invalid_host_names() {
        for text in ["~", "dummy.com :123", "~:123", ":123", "exa mple", "-bad-", "a/b"] {
            assert!(
                matches!(
                    parse_endpoint(text, Some(123)),
                    Err(ConfigError::InvalidValue { ref option, .. }) if option == "host"
                ),
                "{text:?}"
            );
        }
    }

    #[test]
    fn invalid_ports() {
        for text in [
            "dummy.com:",
            "dummy.com:abc",
            "dummy.com:-123",
            "dummy.com:-",
            "dummy.com:65536",
            "dummy.com:70000",
        ] {
            assert!(
                matches!(
                    parse_endpoint(text, Some(123)),
                    Err(ConfigError::InvalidValue { ref option, .. }) if option == "port"
                ),
                "{text:?}"
            );
        }
    }
}

#[test]
fn display_hides_the_password_and_round_trips() {
    let url = parse(
        "etcd://al%20ice:s3cr3t@h1:1,[::1]:2/job%2F?min_nodes=2&db=0&endpoints=h3"
            .replace("%2F", "x")
            .as_str(),
    );
    let shown = url.to_string();
    assert_eq!(shown, "etcd://al%20ice:***@h1:1,[::1]:2,h3/jobx?db=0&min_workers=2");
    assert_eq!(url.redacted(), shown);
    let again = parse(&shown);
    assert_eq!(again.password.as_ref().map(|p| p.expose()), Some("***"));
    assert_eq!(RendezvousUrl { password: url.password.clone(), ..again }, url);
    assert_eq!(parse("mem://local/r").to_string(), "mem://local/r");
    // Port 0 means "none given": left out, so a backend's default applies again.
    assert_eq!(parse("etcd://h:0,[::1]/r").to_string(), "etcd://h,[::1]/r");
    let with_default = RendezvousUrl::parse_with_default_port("redis://:pw@h/r", Some(6379)).expect("valid");
    assert_eq!(with_default.to_string(), "redis://:***@h:6379/r");
}

#[test]
fn passwords_never_appear_in_errors_or_debug() {
    const PW: &str = "s3cr3tPW";
    let ok = parse(&format!("etcd://u:{PW}@h/r?min_workers=1"));
    assert!(!format!("{ok:?}").contains(PW));
    assert!(!ok.to_string().contains(PW));
    assert!(!format!("{:?}", ok.password).contains(PW));
    // Bad input of every kind, with the password in the right place or misplaced by an
    // unencoded delimiter (so that part of it lands in the host, port, path or query).
    let bad = [
        format!("etcd://u:{PW}@exa mple/r"),
        format!("etcd://u:{PW}@h:99999/r"),
        format!("etcd://u:{PW}@h/a/b"),
        format!("etcd://u:{PW}@h/r?min_workers"),
        format!("etcd://u:{PW}@h/r#x"),
        format!("etcd://u:{PW}%zz@h/r"),
        format!("etcd://u%zz:{PW}@h/r"),
        format!("etcd://u:{PW}@/r"),
        format!("etcd://u:{PW}@"),
        format!("e tcd://u:{PW}@h/r"),
        format!("etcd//u:{PW}@h/r"),
        "etcd://u:s3cr/3tPW@h/r".to_string(),
        "etcd://u:123/3tPW@h/r".to_string(),
        "etcd://u:s3cr?3tPW@h/r".to_string(),
        "etcd://u:s3cr#3tPW@h/r".to_string(),
        "etcd://u:s3cr/3tPW@h/r?min_workers=1".to_string(),
        "etcd://s3cr:3tPW/x@h/r".to_string(),
    ];
    for url in &bad {
        let err = match RendezvousUrl::parse(url) {
            Ok(parsed) => panic!("`{url}` should not parse, got {parsed:?}"),
            Err(e) => e,
        };
        for shown in [err.to_string(), format!("{err:?}")] {
            for piece in [PW, "s3cr", "3tPW"] {
                assert!(!shown.contains(piece), "{url}: error shows `{piece}`: {shown}");
            }
        }
    }
}

#[test]
fn errors_are_one_clear_sentence() {
    let err = parse_err("etcd://h:65536/r");
    assert_eq!(
        err.to_string(),
        "invalid value `65536` for `port`: a port must be a whole number from 0 to 65535"
    );
    let err = parse_err("etcd://h");
    assert!(err.to_string().contains("run id is missing"), "{err}");
}

/// The identifier rule (`rdzv_core::ids`) holds at every entry point: the URL's path, the
/// `node_id` option, and parameters built or changed by a library caller.
#[test]
fn identifiers_are_checked_at_every_entry_point() {
    use rdzv_core::RendezvousParams;
    use rdzv_core::ids::{ID_RULE, MAX_ID_LEN};

    let rule_broken = |e: ConfigError, field: &str| match e {
        ConfigError::InvalidValue { option, reason, .. } => {
            assert_eq!(option, field);
            assert!(reason.contains(ID_RULE), "{reason}");
        }
        other => panic!("expected InvalidValue for {field}, got {other:?}"),
    };

    // URL path.
    rule_broken(parse_err(&format!("etcd://h/{}", "r".repeat(MAX_ID_LEN + 1))), "run_id");
    assert_eq!(parse(&format!("etcd://h/{}", "r".repeat(MAX_ID_LEN))).run_id.len(), MAX_ID_LEN);
    // URL option.
    rule_broken(params_err("etcd://h/r?min_workers=1&node_id=a%2Fb"), "node_id");
    rule_broken(params_err("etcd://h/r?min_workers=1&node_id=a+b%0A"), "node_id");
    let p = parse("etcd://h/r?min_workers=1&node_id=host-12-ab12cd").params().expect("valid");
    assert_eq!(p.node_id.as_deref(), Some("host-12-ab12cd"));

    // Library: the constructor and `validate` after changing fields.
    rule_broken(RendezvousParams::new("a/rdzv/v_1/join/x", 1, 1).expect_err("rejected"), "run_id");
    rule_broken(RendezvousParams::new("", 1, 1).expect_err("rejected"), "run_id");
    let mut p = RendezvousParams::new("12345678", 1, 1).expect("a Slurm job id is a run id");
    p.run_id = "a/b".into();
    rule_broken(p.validate().expect_err("rejected"), "run_id");
    p.run_id = "ok".into();
    for bad in ["", "n/1", "n 1", "n\u{7}", &"n".repeat(MAX_ID_LEN + 1)] {
        p.node_id = Some(bad.to_string());
        rule_broken(p.validate().expect_err("rejected"), "node_id");
    }
    p.node_id = Some("trainer-0.trainer.default".into());
    assert_eq!(p.validate(), Ok(()));
    for bad in ["", "10.0.0.1 x", "h\n", &"a".repeat(254)] {
        p.local_addr = Some(bad.to_string());
        assert!(
            matches!(p.validate(), Err(ConfigError::InvalidValue { option, .. }) if option == "local_addr"),
            "{bad:?}"
        );
    }
    p.local_addr = Some("fe80::1%eth0".into());
    assert_eq!(p.validate(), Ok(()));
}

/// Durations that would overflow a deadline (`Instant + d`) are refused when parsed, in
/// every form, and when a library caller sets them.
#[test]
fn durations_are_bounded() {
    for too_long in [
        "18446744073709551615",
        "18446744073709551615s",
        "584942417355y",
        "31536001",
        "365d 1s",
        "2y",
        "9999999999999999999ms",
        "1e308",
    ] {
        match parse_duration("timeout", too_long) {
            Err(ConfigError::InvalidValue { option, .. }) => assert_eq!(option, "timeout"),
            other => panic!("{too_long:?} should be rejected, got {other:?}"),
        }
    }
    let e = parse_duration("timeout", "18446744073709551615").expect_err("too long");
    assert!(e.to_string().contains("at most one year"), "{e}");
    for option in ["timeout", "last_call_timeout", "keep_alive_ttl", "run_ttl"] {
        let url = format!("etcd://h/r?min_workers=1&{option}=18446744073709551615");
        match params_err(&url) {
            ConfigError::InvalidValue { option: o, reason, .. } => {
                assert_eq!(o, option);
                assert!(reason.contains("at most one year"), "{reason}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    let mut p = rdzv_core::RendezvousParams::new("r", 1, 1).expect("valid");
    p.timeout = Duration::MAX;
    assert!(matches!(p.validate(), Err(ConfigError::InvalidValue { option, .. }) if option == "timeout"));
    p.timeout = Duration::from_secs(1);
    p.last_call_timeout = Duration::from_secs(u64::MAX);
    assert!(
        matches!(p.validate(), Err(ConfigError::InvalidValue { option, .. }) if option == "last_call_timeout")
    );
}

/// A file in the temp dir holding `contents`, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("rdzv-url-test-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).expect("write a temp file");
        TempFile(path)
    }
    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn password_file_gives_the_password() {
    let file = TempFile::new("pw", b"hunter2\n");
    let url = parse(&format!("etcd://root@h/job?min_workers=1&password_file={}", file.path()));
    assert_eq!(url.password.as_ref().map(|p| p.expose()), Some("hunter2"), "trailing newline dropped");
    assert_eq!(url.username.as_deref(), Some("root"));
    assert!(!url.options.contains_key("password_file"), "consumed by the parser: {:?}", url.options);
    assert!(!url.to_string().contains("password_file"), "{url}");
    assert!(url.to_string().contains(":***@"), "{url}");
    let crlf = TempFile::new("crlf", b"p w\r\n");
    let url = parse(&format!("redis://h/job?password_file={}", crlf.path()));
    assert_eq!(url.password.as_ref().map(|p| p.expose()), Some("p w"));
}

#[test]
fn password_file_errors_name_the_file_not_the_password() {
    let missing = std::env::temp_dir().join("rdzv-url-test-no-such-file");
    match parse_err(&format!("etcd://u@h/job?password_file={}", missing.display())) {
        ConfigError::InvalidValue { option, value, reason } => {
            assert_eq!(option, "password_file");
            assert_eq!(value, missing.display().to_string());
            assert!(reason.contains("cannot read"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let empty = TempFile::new("empty", b"\n");
    assert!(
        parse_err(&format!("etcd://u@h/job?password_file={}", empty.path())).to_string().contains("empty")
    );
    let binary = TempFile::new("binary", b"hunter2\xff\xfe");
    let e = parse_err(&format!("etcd://u@h/job?password_file={}", binary.path()));
    assert!(matches!(&e, ConfigError::InvalidValue { option, .. } if option == "password_file"), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let file = TempFile::new("both", b"hunter2");
    let e = parse_err(&format!("etcd://u:inline@h/job?password_file={}", file.path()));
    assert!(matches!(&e, ConfigError::InvalidUrl(m) if m.contains("only one")), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !e.to_string().contains("inline"), "{e}");
    let e = parse_err(&format!("etcd://u@h/job?password_file={0}&password_file={0}", file.path()));
    assert!(matches!(e, ConfigError::InvalidUrl(_)), "{e:?}");
}

#[test]
fn password_file_is_offered_by_every_backend() {
    // The registry rejects options no layer knows; `password_file` is the URL parser's own.
    assert!(rdzv_core::url::URL_OPTIONS.contains(&"password_file"));
}

/// A run's address needs no rendezvous sizing; parameters are built from it only where a
/// rendezvous is joined, with the URL's sizing or the caller's default.
#[test]
fn run_address_needs_no_sizing() {
    use rdzv_core::url::RunAddress;
    let address = RunAddress::new(parse("mem://m/job?etcd_prefix=/p&timeout=5"));
    assert_eq!((address.prefix.as_str(), address.run_id.as_str()), ("/p", "job"));
    assert_eq!(address.keys(), rdzv_core::protocol::RunKeys::new("/p", "job"));
    assert_eq!(address.params(), Err(ConfigError::MissingOption("min_workers".into())));
    let p = address.params_or(3, 5).expect("sized by the caller");
    assert_eq!((p.min_workers, p.max_workers, p.timeout), (3, 5, Duration::from_secs(5)));
    assert_eq!(p.prefix, "/p");
    assert_eq!(address.params_or(3, 1).expect("max raised to min").max_workers, 3);

    let address = RunAddress::new(parse("mem://m/job"));
    assert_eq!(address.prefix, DEFAULT_PREFIX);
    // The URL's sizing wins over the caller's default, in part or in whole.
    for (url, sizing) in [
        ("mem://m/job?min_workers=2", (2, 2)),
        ("mem://m/job?min_nodes=2&max_nodes=6", (2, 6)),
        ("mem://m/job?max_workers=9", (3, 9)),
    ] {
        let p = RunAddress::new(parse(url)).params_or(3, 4).expect("valid");
        assert_eq!((p.min_workers, p.max_workers), sizing, "{url}");
    }
    let mut address = RunAddress::new(parse("mem://m/job?min_workers=1"));
    address.run_id = "job-2".into();
    assert_eq!(address.params().expect("valid").run_id, "job-2");
    assert_eq!(address.keys(), rdzv_core::protocol::RunKeys::new(DEFAULT_PREFIX, "job-2"));
    assert!(matches!(
        RunAddress::new(parse("mem://m/job?max_workers=2")).params_or(3, 4),
        Err(ConfigError::InvalidValue { option, .. }) if option == "max_workers"
    ));
}

/// Every rendezvous option's alias is accepted wherever options are read, and counts as
/// the option itself.
#[test]
fn aliases_come_from_one_table() {
    use std::collections::BTreeMap;
    let aliased: Vec<(&str, &str)> =
        rdzv_core::params::OPTIONS.iter().filter_map(|(name, alias)| alias.map(|a| (a, *name))).collect();
    assert_eq!(
        aliased,
        [("min_nodes", "min_workers"), ("max_nodes", "max_workers"), ("etcd_prefix", "prefix")]
    );
    for (alias, name) in aliased {
        assert_eq!(rdzv_core::params::canonical_option_name(alias), name);
        let url = parse(&format!("mem://m/r?{alias}=1"));
        assert_eq!(url.rendezvous_options.keys().collect::<Vec<_>>(), [name], "{alias}");
        let err = parse_err(&format!("mem://m/r?{alias}=1&{name}=1"));
        assert!(
            matches!(err, ConfigError::InvalidUrl(ref m) if m.contains("more than once")),
            "{alias}: {err}"
        );
        let mut map = BTreeMap::new();
        map.insert(alias.to_string(), "1".to_string());
        map.insert(name.to_string(), "1".to_string());
        assert_eq!(rdzv_core::RendezvousParams::from_options("r", &map), Err(err), "{alias}: the same error");
    }
}

#[test]
fn redacting_a_url_text_hides_only_the_password() {
    use rdzv_core::url::redact_url_text;
    for (input, expected) in [
        ("redis://:s3cret@h:6379/job?min_workers=2", Some("redis://:***@h:6379/job?min_workers=2")),
        ("etcd://root:p%40ss@h1,h2:2379/job?x=1", Some("etcd://root:***@h1,h2:2379/job?x=1")),
        ("etcd://root@h/job?password_file=/run/pw", Some("etcd://root@h/job?password_file=/run/pw")),
        ("etcd://root:@h/job", Some("etcd://root:@h/job")),
        ("mem://x/job", Some("mem://x/job")),
        ("etcd://h/user@host", Some("etcd://h/user@host")),
        // Cannot tell where the password ends: the whole text must go.
        ("etcd://u:pa/ss@h/job", None),
        ("etcd://u:pa?ss@h/job", None),
        ("not a url s3cret", None),
    ] {
        assert_eq!(redact_url_text(input).as_deref(), expected, "{input}");
    }
}

/// The parser knows no Redis: a database-like path is refused by the Redis factory
/// (crates/rdzv-redis/src/factory.rs), not here.
#[test]
fn run_ids_of_digits_are_run_ids() {
    for url in ["redis://h/0", "etcd://h/0", "mem://m/15"] {
        assert!(parse(url).run_id.chars().all(|c| c.is_ascii_digit()), "{url}");
    }
}
