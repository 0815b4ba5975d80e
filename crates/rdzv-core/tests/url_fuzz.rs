//! Property tests of the URL parser: it never panics, whatever the input; every URL it
//! accepts survives parse → Display → parse (with the password shown as `***`); generated
//! valid URLs parse to exactly what was generated; and a broken URL's error never shows
//! its password.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use rdzv_core::RendezvousUrl;
use rdzv_core::url::Endpoint;

/// Percent-encodes everything but ASCII letters and digits, independently of the crate's
/// own encoder.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// Display → parse again gives the same URL, except for the password, which shows as `***`.
fn assert_round_trip(url: &RendezvousUrl) -> Result<(), TestCaseError> {
    let shown = url.to_string();
    let again = RendezvousUrl::parse_with_default_port(&shown, None)
        .map_err(|e| TestCaseError::fail(format!("`{shown}` does not parse again: {e}")))?;
    prop_assert_eq!(again.password.as_ref().map(|p| p.expose()), url.password.as_ref().map(|_| "***"));
    prop_assert_eq!(RendezvousUrl { password: url.password.clone(), ..again }, url.clone());
    if url.password.is_some() {
        prop_assert!(shown.contains(":***@"), "`{}` hides no password", shown);
    }
    Ok(())
}

/// Parsing must not panic; what parses must round-trip and its parameters must not panic.
fn check_any(input: &str) -> Result<(), TestCaseError> {
    for default_port in [None, Some(2379)] {
        if let Ok(url) = RendezvousUrl::parse_with_default_port(input, default_port) {
            assert_round_trip(&url)?;
            let _ = url.params();
            let _ = rdzv_core::url::RunAddress::new(url).params_or(1, 1);
        }
    }
    let _ = RendezvousUrl::parse(input);
    Ok(())
}

#[derive(Clone, Debug)]
enum Host {
    Name(String),
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

impl Host {
    fn written(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::V4(a) => a.to_string(),
            Host::V6(a) => format!("[{a}]"),
        }
    }
    fn parsed(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::V4(a) => a.to_string(),
            Host::V6(a) => a.to_string(),
        }
    }
}

fn host() -> impl Strategy<Value = Host> {
    prop_oneof![
        "[a-z_]([a-z0-9_-]{0,8}[a-z0-9_])?(\\.[a-z0-9_]([a-z0-9_-]{0,8}[a-z0-9_])?){0,3}"
            .prop_filter("all-numeric names are IPv4 addresses", |h| {
                !h.split('.').all(|l| l.chars().all(|c| c.is_ascii_digit()))
            })
            .prop_map(Host::Name),
        any::<Ipv4Addr>().prop_map(Host::V4),
        any::<Ipv6Addr>().prop_map(Host::V6),
    ]
}

fn endpoint() -> impl Strategy<Value = (Host, Option<u16>)> {
    (host(), proptest::option::of(any::<u16>()))
}

fn write_endpoint((host, port): &(Host, Option<u16>)) -> String {
    match port {
        Some(p) => format!("{}:{p}", host.written()),
        None => host.written(),
    }
}

/// A valid URL, as its parts.
#[derive(Clone, Debug)]
struct Parts {
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    hosts: Vec<(Host, Option<u16>)>,
    extra: Vec<(Host, Option<u16>)>,
    run_id: String,
    rendezvous: BTreeMap<String, String>,
    backend: BTreeMap<String, String>,
    use_aliases: bool,
    /// The port a host without one gets (what a backend's factory would give).
    default_port: Option<u16>,
}

impl Parts {
    fn url(&self) -> String {
        let mut s = format!("{}://", self.scheme);
        if self.user.is_some() || self.password.is_some() {
            if let Some(u) = &self.user {
                s.push_str(&enc(u));
            }
            if let Some(p) = &self.password {
                s.push(':');
                s.push_str(&enc(p));
            }
            s.push('@');
        }
        s.push_str(&self.hosts.iter().map(write_endpoint).collect::<Vec<_>>().join(","));
        s.push('/');
        s.push_str(&enc(&self.run_id));
        let mut query = Vec::new();
        if !self.extra.is_empty() {
            let list = self.extra.iter().map(write_endpoint).collect::<Vec<_>>().join(",");
            query.push(format!("endpoints={}", enc(&list)));
        }
        for (name, value) in &self.rendezvous {
            let alias = rdzv_core::params::OPTIONS.iter().find(|(c, _)| c == name).and_then(|(_, a)| *a);
            let written = match alias {
                Some(alias) if self.use_aliases => alias,
                _ => name.as_str(),
            };
            query.push(format!("{written}={}", enc(value)));
        }
        for (name, value) in &self.backend {
            query.push(format!("{name}={}", enc(value)));
        }
        if !query.is_empty() {
            s.push('?');
            s.push_str(&query.join("&"));
        }
        s
    }

    fn expected_endpoints(&self) -> Vec<Endpoint> {
        let default = self.default_port.unwrap_or(0);
        let mut out: Vec<Endpoint> = Vec::new();
        for (host, port) in self.hosts.iter().chain(&self.extra) {
            let e = Endpoint { host: host.parsed(), port: port.unwrap_or(default) };
            if !out.contains(&e) {
                out.push(e);
            }
        }
        out
    }
}

fn parts() -> impl Strategy<Value = Parts> {
    let scheme = prop_oneof![
        Just("etcd".to_string()),
        Just("etcds".to_string()),
        Just("redis".to_string()),
        Just("rediss".to_string()),
        Just("mem".to_string()),
        "[a-z][a-z0-9+.-]{0,8}",
    ];
    let rendezvous_name =
        prop::sample::select(rdzv_core::params::option_names().collect::<Vec<_>>()).prop_map(String::from);
    let backend_name =
        prop::sample::select(vec!["db", "cacert", "cert", "key", "user-opt", "x.y"]).prop_map(String::from);
    (
        scheme,
        proptest::option::of("\\PC{1,10}"),
        proptest::option::of("\\PC{1,10}"),
        prop::collection::vec(endpoint(), 1..4),
        prop::collection::vec(endpoint(), 0..3),
        "[A-Za-z0-9_.:@+-]{1,12}",
        prop::collection::btree_map(rendezvous_name, "\\PC{1,8}", 0..5),
        prop::collection::btree_map(backend_name, "\\PC{1,8}", 0..3),
        (any::<bool>(), proptest::option::of(1..=u16::MAX)),
    )
        .prop_map(
            |(
                scheme,
                user,
                password,
                hosts,
                extra,
                run_id,
                rendezvous,
                backend,
                (use_aliases, default_port),
            )| {
                Parts {
                    scheme,
                    user,
                    password,
                    hosts,
                    extra,
                    run_id,
                    rendezvous,
                    backend,
                    use_aliases,
                    default_port,
                }
            },
        )
}

/// One change to a URL's text.
#[derive(Clone, Debug)]
enum Mutation {
    Insert(usize, char),
    Remove(usize),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![
        prop::sample::select(vec![':', '/', '@', '?', '&', '=', '%', '[', ']', ',', '#', ' ', '.', '-', '+']),
        any::<char>(),
    ];
    prop_oneof![
        (any::<usize>(), interesting).prop_map(|(i, c)| Mutation::Insert(i, c)),
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for m in mutations {
        let n = chars.len().max(1);
        match *m {
            Mutation::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
            Mutation::Remove(i) => {
                if !chars.is_empty() {
                    chars.remove(i % n);
                }
            }
            Mutation::Duplicate(a, b) => {
                let (start, end) = ((a % n).min(b % n), (a % n).max(b % n));
                let piece: Vec<char> = chars.get(start..end).map(<[char]>::to_vec).unwrap_or_default();
                let at = end.min(chars.len());
                chars.splice(at..at, piece);
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(input in any::<String>()) {
        check_any(&input)?;
    }

    #[test]
    fn url_like_strings_never_panic(
        scheme in prop::sample::select(vec!["etcd://", "redis://", "mem://", "x://", "", "etcd:/"]),
        body in "[a-zA-Z0-9:/@?&=%\\[\\].,_~+# -]{0,60}",
    ) {
        check_any(&format!("{scheme}{body}"))?;
    }

    /// Whatever a run id's characters, the URL parser accepts it exactly when the
    /// identifier rule does.
    #[test]
    fn run_ids_follow_the_identifier_rule(run_id in "\\PC{1,12}") {
        let parsed = RendezvousUrl::parse(&format!("etcd://h/{}", enc(&run_id)));
        let rule = rdzv_core::ids::validate_id("run_id", &run_id);
        prop_assert_eq!(parsed.is_ok(), rule.is_ok(), "{:?}: {:?} vs {:?}", run_id, parsed, rule);
        if let Ok(url) = parsed {
            prop_assert_eq!(url.run_id, run_id);
        }
    }

    #[test]
    fn valid_urls_parse_to_their_parts_and_round_trip(p in parts()) {
        let text = p.url();
        let url = RendezvousUrl::parse_with_default_port(&text, p.default_port)
            .map_err(|e| TestCaseError::fail(format!("`{text}` should parse: {e}")))?;
        prop_assert_eq!(&url.scheme, &p.scheme);
        prop_assert_eq!(url.endpoints.clone(), p.expected_endpoints());
        prop_assert_eq!(url.username.as_deref(), p.user.as_deref());
        prop_assert_eq!(url.password.as_ref().map(|s| s.expose()), p.password.as_deref());
        prop_assert_eq!(&url.run_id, &p.run_id);
        prop_assert_eq!(&url.rendezvous_options, &p.rendezvous);
        prop_assert_eq!(&url.options, &p.backend);
        assert_round_trip(&url)?;
        let _ = url.params();
    }

    #[test]
    fn mutated_urls_never_panic(p in parts(), mutations in prop::collection::vec(mutation(), 1..5)) {
        check_any(&mutate(&p.url(), &mutations))?;
    }

    #[test]
    fn errors_never_show_the_password(
        p in parts(),
        pw in "PW[A-Z]{6}",
        breakage in prop::sample::select(vec![
            ":99999/", ":x/", "/a/b", "/%zz", " /", "/r?min_workers", "/r?=1", "/r?a=%", "/r#",
            "/r?min_workers=1&min_nodes=2", "/r?endpoints=h:70000", ",,/", ",-bad-/",
        ]),
    ) {
        // Lower-case parts and an upper-case password cannot coincide by chance.
        let mut p = p;
        p.password = Some(pw.clone());
        p.user = p.user.map(|u| u.to_lowercase());
        p.hosts.truncate(1);
        let text = p.url();
        let Some(at) = text.rfind('@') else {
            return Err(TestCaseError::fail("a URL with a password has an `@`"));
        };
        let host_end = text[at..].find('/').map_or(text.len(), |i| at + i);
        let broken = format!("{}{}", &text[..host_end], breakage);
        if let Err(e) = RendezvousUrl::parse(&broken) {
            prop_assert!(!e.to_string().contains(&pw), "`{}` → {}", broken, e);
            prop_assert!(!format!("{e:?}").contains(&pw), "`{}` → {:?}", broken, e);
        }
    }
}
