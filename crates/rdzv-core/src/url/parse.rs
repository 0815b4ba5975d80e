//! The parser of [`RendezvousUrl`]s and of their parts, with the password rules of the
//! module's documentation (`url/mod.rs`).

use std::collections::BTreeMap;

use crate::error::ConfigError;
use crate::params::{DEFAULT_PREFIX, RendezvousParams, insert_option, is_rendezvous_option};
use crate::rendezvous::RunKeys;

/// A host and port of a backend server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Host name, IPv4 address, or IPv6 address without brackets.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A password: never shown by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret string.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for handing to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A parsed rendezvous URL: where the backend is, how to log in, which run, and the
/// options. The rendezvous parameters are parsed out by [`RendezvousUrl::params`]; what a
/// backend understands it takes from [`RendezvousUrl::options`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousUrl {
    /// The scheme, lower-case (`etcd`, `etcds`, `redis`, `rediss`, `mem`, or a user's).
    pub scheme: String,
    /// The servers: the URL's host plus any `endpoints=` option. A host without a port gets
    /// the default port the URL was parsed with (its backend's, when parsed by the
    /// [`Registry`](crate::Registry)), else port 0, "no port" (as in `mem://<name>/…`).
    pub endpoints: Vec<Endpoint>,
    /// User name, if given.
    pub username: Option<String>,
    /// Password, if given.
    pub password: Option<Secret>,
    /// The run id (the URL's path without its leading `/`), percent-decoded.
    pub run_id: String,
    /// Every query option that is not a rendezvous parameter, by its canonical name.
    pub options: BTreeMap<String, String>,
    /// The rendezvous parameters' query options as given (canonical names).
    pub rendezvous_options: BTreeMap<String, String>,
}

/// Options that the URL parser itself consumes (they end up in [`RendezvousUrl::endpoints`]
/// or [`RendezvousUrl::password`]), so a backend never sees them.
pub const URL_OPTIONS: &[&str] = &["endpoints", "password_file"];

/// The environment variable that gives the password when the URL does not (see the
/// module's documentation for when it applies).
pub const PASSWORD_ENV: &str = "RDZV_PASSWORD";

/// How to write a URL (appended to syntax errors).
const URL_FORM: &str = "expected scheme://[user:password@]host[:port][,host[:port]…]/<run_id>?option=value&…, \
     e.g. etcd://localhost:2379/job1?min_workers=2";

/// Said instead of any detail when a detail might show part of a password.
const MAYBE_SECRET: &str = "the URL does not parse and has an `@` after its host part, so a \
     user name or password may contain an unencoded `/`, `?` or `#` (details withheld so that \
     no password is shown); percent-encode those characters (`%2F`, `%3F`, `%23`)";

impl RendezvousUrl {
    /// Parses a rendezvous URL's generic structure, without any backend's knowledge: a host
    /// without a port gets port 0 ("no port"). See
    /// [`RendezvousUrl::parse_with_default_port`] for the rules; to parse a URL for the
    /// backend its scheme names (its default port, its own rules), use
    /// [`Registry::parse_address`](crate::Registry::parse_address) or
    /// [`Registry::parse`](crate::Registry::parse).
    ///
    /// ```
    /// use rdzv_core::RendezvousUrl;
    /// let url = RendezvousUrl::parse("etcd://localhost:2379/job1?min_workers=2").expect("valid");
    /// assert_eq!(url.endpoints[0].port, 2379);
    /// assert_eq!(url.run_id, "job1");
    /// assert_eq!(url.rendezvous_options["min_workers"], "2");
    /// assert_eq!(RendezvousUrl::parse("mem://store/job1").expect("valid").endpoints[0].port, 0);
    /// ```
    pub fn parse(input: &str) -> Result<Self, ConfigError> {
        Self::parse_with_default_port(input, None)
    }

    /// Parses `scheme://[user:password@]host[:port][,host[:port]…]/<run_id>?options`, with
    /// `default_port` for hosts that name none (`None`: such a host gets port 0, "no port").
    ///
    /// Rules: the scheme is lower-cased; hosts are names (dot-separated labels of letters,
    /// digits, `-`, `_`, not starting or ending with `-`), IPv4 addresses, or IPv6 addresses
    /// in brackets (`[::1]:2379`); ports are 0 to 65535; more hosts may follow
    /// comma-separated, or in the option `endpoints=h2:2379,h3:2379`; user name and password
    /// are percent-decoded; the run id is the path, one non-empty percent-decoded segment;
    /// options are `name=value`, percent-decoded (`+` is a plain plus), each at most once,
    /// aliases mapped to canonical names (see
    /// [`canonical_option_name`](crate::params::canonical_option_name)); the run id follows
    /// [`validate_id`](crate::ids::validate_id); the password comes from the URL,
    /// `password_file=` or, for a URL naming a user, `RDZV_PASSWORD` (read here; see the
    /// [module's documentation](crate::url)). Every error is one [`ConfigError`] that never
    /// contains the password.
    pub fn parse_with_default_port(input: &str, default_port: Option<u16>) -> Result<Self, ConfigError> {
        let env_password = std::env::var(PASSWORD_ENV).ok();
        parse_with_password_env(input, default_port, env_password.as_deref())
    }

    /// The rendezvous parameters this URL gives: its run id and its rendezvous options with
    /// docs/PROTOCOL.md's defaults (`min_workers` is required; `max_workers` defaults to it).
    pub fn params(&self) -> Result<RendezvousParams, ConfigError> {
        RendezvousParams::from_options(&self.run_id, &self.rendezvous_options)
    }

    /// The URL with its password replaced by `***`, for logs and messages (the same as its
    /// `Display`).
    pub fn redacted(&self) -> String {
        self.to_string()
    }
}

/// Where a run lives, parsed from a URL that need not size a rendezvous: the backend to
/// connect (the URL's scheme, endpoints, credentials and backend options), the key prefix
/// and the run id. What opens a run without joining a round — a Store on its own,
/// `rdzv status`, `rdzv close` — needs only this; [`RendezvousParams`] are built from it,
/// with [`RunAddress::params`] or [`RunAddress::params_or`], only where a rendezvous is
/// joined. Get one from [`Registry::parse_address`](crate::Registry::parse_address) (which
/// applies the backend's rules) or [`RunAddress::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAddress {
    /// The parsed URL, as its backend's factory connects to it (its `Display` hides the
    /// password). Its rendezvous options are read only when parameters are built.
    pub url: RendezvousUrl,
    /// The key prefix under which all runs live: the option `prefix`, else
    /// [`DEFAULT_PREFIX`].
    pub prefix: String,
    /// The run: the URL's path, unless changed (as `rdzv bench` does to get a fresh run).
    pub run_id: String,
}

impl RunAddress {
    /// The address `url` names: its prefix option (or the default) and its run id.
    pub fn new(url: RendezvousUrl) -> Self {
        let prefix = url.rendezvous_options.get("prefix").map_or(DEFAULT_PREFIX, String::as_str).to_string();
        let run_id = url.run_id.clone();
        RunAddress { url, prefix, run_id }
    }

    /// The run's key layout (docs/PROTOCOL.md "Keys").
    pub fn keys(&self) -> RunKeys {
        RunKeys::new(&self.prefix, &self.run_id)
    }

    /// The parameters to join this run with: the URL's rendezvous options (which must give
    /// `min_workers`) and this address's run id. Errors as
    /// [`RendezvousParams::from_options`].
    pub fn params(&self) -> Result<RendezvousParams, ConfigError> {
        RendezvousParams::from_options(&self.run_id, &self.url.rendezvous_options)
    }

    /// As [`RunAddress::params`], but a URL without `min_workers` gives a rendezvous of
    /// `default_min ..= max(default_min, default_max)` workers (see
    /// [`RendezvousParams::from_options_or`]): for tools that size it themselves.
    pub fn params_or(&self, default_min: usize, default_max: usize) -> Result<RendezvousParams, ConfigError> {
        RendezvousParams::from_options_or(
            &self.run_id,
            &self.url.rendezvous_options,
            default_min,
            default_max,
        )
    }
}

/// Writes the URL so that parsing it again gives the same URL, except that the password is
/// shown as `***`. A port is left out only where it is 0, "no port" (like `mem://name/run`).
/// All options appear in name order.
impl std::fmt::Display for RendezvousUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if self.username.is_some() || self.password.is_some() {
            if let Some(user) = &self.username {
                f.write_str(&encode(user, USERINFO_SAFE))?;
            }
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if endpoint.port == 0 {
                if endpoint.host.contains(':') {
                    write!(f, "[{}]", endpoint.host)?;
                } else {
                    f.write_str(&endpoint.host)?;
                }
            } else {
                write!(f, "{endpoint}")?;
            }
        }
        write!(f, "/{}", encode(&self.run_id, RUN_ID_SAFE))?;
        let all: BTreeMap<&String, &String> =
            self.rendezvous_options.iter().chain(self.options.iter()).collect();
        for (i, (name, value)) in all.into_iter().enumerate() {
            let sep = if i == 0 { '?' } else { '&' };
            write!(f, "{sep}{}={}", encode(name, QUERY_SAFE), encode(value, QUERY_SAFE))?;
        }
        Ok(())
    }
}

/// The scheme of `input`, lower-cased, or why there is none.
pub(crate) fn scheme_of(input: &str) -> Result<String, ConfigError> {
    let input = input.trim();
    let Some((scheme, _)) = input.split_once("://") else {
        return Err(ConfigError::InvalidUrl(format!("no `://` found; {URL_FORM}")));
    };
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        // The text before `://` might be anything, even a password: do not echo it.
        return Err(ConfigError::InvalidUrl(format!(
            "the scheme must start with a letter and contain only letters, digits, `+`, `-`, `.`; {URL_FORM}"
        )));
    }
    Ok(scheme.to_ascii_lowercase())
}

/// Whether a detailed parse error could echo part of a password: that is so when an `@`
/// comes after the host part (in the path or the first option), which happens when a
/// password holds an unencoded `/` or `?`.
fn might_show_secret(input: &str) -> bool {
    let Some((_, rest)) = input.split_once("://") else {
        return false;
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let path = before_query.find('/').map_or("", |i| &before_query[i..]);
    let first_option = query.map_or("", |q| q.split('&').next().unwrap_or(""));
    path.contains('@') || first_option.contains('@')
}

/// [`RendezvousUrl::parse_with_default_port`] with the value of `RDZV_PASSWORD` given
/// (`env_password`), so that tests need not change the process's environment.
fn parse_with_password_env(
    input: &str,
    default_port: Option<u16>,
    env_password: Option<&str>,
) -> Result<RendezvousUrl, ConfigError> {
    let (mut url, password_file) = parse_url(input, default_port).map_err(|e| {
        if might_show_secret(input) { ConfigError::InvalidUrl(MAYBE_SECRET.to_string()) } else { e }
    })?;
    if let Some(path) = password_file {
        if url.password.is_some() {
            return Err(ConfigError::InvalidUrl(
                "the URL gives both a password and `password_file`; give only one (password_file \
                 keeps the password out of the URL)"
                    .into(),
            ));
        }
        url.password = Some(read_password_file(&path)?);
    } else {
        url.take_password_from_env(env_password, false);
    }
    Ok(url)
}

impl RendezvousUrl {
    /// Fills in a missing password from `env_password` (the value of `RDZV_PASSWORD`; empty
    /// counts as unset) when the URL names a user, or when `password_alone` says the
    /// backend's servers take a password without a user name.
    fn take_password_from_env(&mut self, env_password: Option<&str>, password_alone: bool) {
        if self.password.is_none() && (self.username.is_some() || password_alone) {
            self.password = env_password.filter(|p| !p.is_empty()).map(Secret::new);
        }
    }

    /// [`RendezvousUrl::take_password_from_env`] with the process's `RDZV_PASSWORD`, for the
    /// registry once it knows the backend.
    pub(crate) fn take_password_from_process_env(&mut self, password_alone: bool) {
        let env_password = std::env::var(PASSWORD_ENV).ok();
        self.take_password_from_env(env_password.as_deref(), password_alone);
    }
}

/// The password in the file at `path`, without its trailing line breaks. Errors name the
/// path and the reason, never what the file holds.
fn read_password_file(path: &str) -> Result<Secret, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidValue {
        option: "password_file".into(),
        value: path.to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        invalid(format!(
            "cannot read the password from it ({e}); name a readable file that holds only the password"
        ))
    })?;
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(invalid("the file is empty; put the password in it".into()));
    }
    Ok(Secret::new(password))
}

/// `input`, a URL as written, with the password of its user part replaced by `***` and
/// everything else (hosts, run id, options, including `password_file=`) left as it was, for
/// handing a URL on to a process that must not see the password. `None` when `input` does
/// not parse (then where a password might be cannot be told: drop the whole text). Reads
/// neither the password file nor the environment.
///
/// `rdzv run` is its one user; it lives here, not in the CLI, because it must agree with
/// this parser on where a URL's user part ends, which only this module knows.
///
/// ```
/// use rdzv_core::url::redact_url_text;
/// assert_eq!(
///     redact_url_text("redis://:s3cret@h:6379/job?min_workers=2").as_deref(),
///     Some("redis://:***@h:6379/job?min_workers=2"),
/// );
/// assert_eq!(redact_url_text("etcd://h/job").as_deref(), Some("etcd://h/job"));
/// assert_eq!(redact_url_text("etcd://u:pa/ss@h/job"), None);
/// ```
pub fn redact_url_text(input: &str) -> Option<String> {
    parse_url(input, None).ok()?;
    // The URL parsed, so its user part is exactly what `parse_url` took it to be: the text
    // between `://` and the last `@` before the first `/` of the part before any `?`.
    let start = input.find("://")? + 3;
    let rest = &input[start..];
    let before_query = rest.find('?').map_or(rest, |i| &rest[..i]);
    let authority = before_query.find('/').map_or(before_query, |i| &before_query[..i]);
    let Some(at) = authority.rfind('@') else { return Some(input.to_string()) };
    match authority[..at].find(':') {
        Some(colon) if colon + 1 < at => {
            Some(format!("{}***{}", &input[..start + colon + 1], &input[start + at..]))
        }
        _ => Some(input.to_string()),
    }
}

/// Parses the URL's text; returns it with the path of its `password_file=` option (read
/// by the caller).
fn parse_url(input: &str, default_port: Option<u16>) -> Result<(RendezvousUrl, Option<String>), ConfigError> {
    let input = input.trim();
    let scheme = scheme_of(input)?;
    let rest = input.split_once("://").map_or("", |(_, rest)| rest);
    if rest.contains('#') {
        return Err(ConfigError::InvalidUrl(
            "a `#` is not allowed in a rendezvous URL; percent-encode it as `%23`".into(),
        ));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (username, password) = parse_userinfo(userinfo)?;

    let mut endpoints = Vec::new();
    for item in hosts.split(',') {
        push_unique(&mut endpoints, parse_endpoint(item, default_port)?);
    }
    let run_id = parse_run_id(path)?;

    let mut options = BTreeMap::new();
    let mut rendezvous_options = BTreeMap::new();
    let mut url_options = BTreeMap::new();
    for item in query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let Some((raw_name, raw_value)) = item.split_once('=') else {
            return Err(ConfigError::InvalidUrl(format!(
                "the option `{}` has no value; write it as name=value",
                decode_lossy(item)
            )));
        };
        let name = decode(raw_name)
            .map_err(|why| ConfigError::InvalidUrl(format!("an option name is not valid: {why}")))?;
        let value = decode(raw_value).map_err(|why| ConfigError::InvalidValue {
            option: name.clone(),
            value: raw_value.to_string(),
            reason: why,
        })?;
        if name.is_empty() {
            return Err(ConfigError::InvalidUrl(
                "an option has no name (`=value`); write it as name=value".into(),
            ));
        }
        if value.is_empty() {
            return Err(ConfigError::InvalidValue {
                option: name,
                value,
                reason: "an option needs a value; leave it out for the default".into(),
            });
        }
        let target = if URL_OPTIONS.contains(&name.as_str()) {
            &mut url_options
        } else if is_rendezvous_option(&name) {
            &mut rendezvous_options
        } else {
            &mut options
        };
        insert_option(target, &name, value)?;
    }
    if let Some(value) = url_options.remove("endpoints") {
        for item in value.split(',') {
            push_unique(&mut endpoints, parse_endpoint(item, default_port)?);
        }
    }
    let password_file = url_options.remove("password_file");
    let url = RendezvousUrl { scheme, endpoints, username, password, run_id, options, rendezvous_options };
    Ok((url, password_file))
}

fn push_unique(endpoints: &mut Vec<Endpoint>, endpoint: Endpoint) {
    if !endpoints.contains(&endpoint) {
        endpoints.push(endpoint);
    }
}

/// Splits and decodes `user:password`; an empty user or password counts as absent (so
/// `redis://:secret@host` has a password only). Errors never echo the text.
fn parse_userinfo(userinfo: Option<&str>) -> Result<(Option<String>, Option<Secret>), ConfigError> {
    let Some(userinfo) = userinfo else {
        return Ok((None, None));
    };
    let (user, password) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (userinfo, None),
    };
    let user =
        decode(user).map_err(|why| ConfigError::InvalidUrl(format!("the user name is not valid: {why}")))?;
    let password = match password {
        Some(p) => Some(decode(p).map_err(|_| {
            ConfigError::InvalidUrl(
                "the password is not valid percent-encoding (a `%` must be followed by two hex \
                 digits and the result must be UTF-8); encode `%` as `%25`"
                    .into(),
            )
        })?),
        None => None,
    };
    Ok((Some(user).filter(|u| !u.is_empty()), password.filter(|p| !p.is_empty()).map(Secret::new)))
}

/// Parses one `host[:port]` or `[ipv6][:port]`, as the reference's
/// `parse_rendezvous_endpoint` does, except that an empty host is an error.
pub fn parse_endpoint(text: &str, default_port: Option<u16>) -> Result<Endpoint, ConfigError> {
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let Some((address, after)) = inner.split_once(']') else {
            return Err(invalid_host(text, "an IPv6 address in `[` lacks its closing `]`"));
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(invalid_host(
                text,
                "the text in brackets is not an IPv6 address (like `[::1]` or `[2001:db8::1]`)",
            ));
        }
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => {
                    return Err(invalid_host(text, "after `]` only `:port` may follow, e.g. `[::1]:2379`"));
                }
            },
        };
        (address, port)
    } else {
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        if host.contains(':') {
            return Err(invalid_host(text, "an IPv6 address must be written in brackets, e.g. `[::1]:2379`"));
        }
        validate_host_name(host).map_err(|why| invalid_host(host, why))?;
        (host, port)
    };
    let port = match port {
        Some(p) => parse_port(p)?,
        None => default_port.unwrap_or(0),
    };
    Ok(Endpoint { host: host.to_string(), port })
}

fn invalid_host(host: &str, reason: &str) -> ConfigError {
    ConfigError::InvalidValue { option: "host".into(), value: host.to_string(), reason: reason.to_string() }
}

/// A host name or IPv4 address: dot-separated labels of letters, digits, `-` and `_`, none
/// empty or starting or ending with `-`; all-numeric means an IPv4 address, which must be
/// valid.
fn validate_host_name(host: &str) -> Result<(), &'static str> {
    const RULE: &str = "a host must be a dot-separated list of labels (letters, digits, `-`, \
         `_`; not starting or ending with `-`), an IPv4 address, or an IPv6 address in brackets";
    if host.is_empty() {
        return Err("the host is empty; name a server, e.g. `localhost:2379`");
    }
    if host.len() > 253 {
        return Err("a host name is at most 253 characters long");
    }
    let labels: Vec<&str> = host.split('.').collect();
    for label in &labels {
        let valid = !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            return Err(RULE);
        }
    }
    let numeric = labels.iter().all(|l| l.chars().all(|c| c.is_ascii_digit()));
    if numeric && host.parse::<std::net::Ipv4Addr>().is_err() {
        return Err("an all-numeric host must be an IPv4 address like `10.0.0.1`");
    }
    Ok(())
}

fn parse_port(text: &str) -> Result<u16, ConfigError> {
    let invalid = || ConfigError::InvalidValue {
        option: "port".into(),
        value: text.to_string(),
        reason: "a port must be a whole number from 0 to 65535".into(),
    };
    if text.is_empty() || !text.chars().all(|c| c.is_ascii_digit()) {
        return Err(invalid());
    }
    text.parse::<u16>().map_err(|_| invalid())
}

/// The run id from the URL's path (`/<run_id>`, one trailing `/` tolerated).
fn parse_run_id(path: &str) -> Result<String, ConfigError> {
    let raw = path.strip_prefix('/').unwrap_or(path);
    let raw = raw.strip_suffix('/').unwrap_or(raw);
    if raw.is_empty() {
        return Err(ConfigError::InvalidUrl(
            "the run id is missing: give it as the URL's path, e.g. etcd://localhost:2379/job1".into(),
        ));
    }
    if raw.contains('/') {
        return Err(ConfigError::InvalidValue {
            option: "run_id".into(),
            value: raw.to_string(),
            reason: "the run id must be a single path segment (no `/`)".into(),
        });
    }
    let run_id = decode(raw).map_err(|why| ConfigError::InvalidValue {
        option: "run_id".into(),
        value: raw.to_string(),
        reason: why,
    })?;
    crate::ids::validate_id("run_id", &run_id)?;
    Ok(run_id)
}

/// Percent-decodes `text` (`+` stays a plus); the error says why it is not valid.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let digit = |j: usize| bytes.get(j).and_then(|c| char::from(*c).to_digit(16));
            match (digit(i + 1), digit(i + 2)) {
                // Two hex digits make at most 255: the cast cannot truncate.
                (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                _ => {
                    return Err(
                        "a `%` must be followed by two hex digits; encode `%` itself as `%25`".to_string()
                    );
                }
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the percent-decoded text is not UTF-8".to_string())
}

/// Decodes for an error message, keeping the raw text where it does not decode.
fn decode_lossy(text: &str) -> String {
    decode(text).unwrap_or_else(|_| text.to_string())
}

/// Characters left as they are when writing a user name.
const USERINFO_SAFE: &str = "-._~!$'()*+;=";
/// Characters left as they are when writing a run id.
const RUN_ID_SAFE: &str = "-._~!$'()*+,;=:";
/// Characters left as they are when writing an option name or value.
const QUERY_SAFE: &str = "-._~!$'()*+,;:/";

/// Percent-encodes every byte of `text` that is neither an ASCII letter or digit nor in
/// `safe`.
fn encode(text: &str, safe: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if b.is_ascii_alphanumeric() || (b.is_ascii() && safe.as_bytes().contains(&b)) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_env(url: &str, env: Option<&str>) -> RendezvousUrl {
        parse_with_password_env(url, None, env).unwrap_or_else(|e| panic!("`{url}` should parse: {e}"))
    }

    fn password(url: &RendezvousUrl) -> Option<&str> {
        url.password.as_ref().map(Secret::expose)
    }

    #[test]
    fn rdzv_password_fills_in_a_missing_password() {
        assert_eq!(password(&with_env("etcd://root@h/job", Some("s3cret"))), Some("s3cret"));
        assert_eq!(password(&with_env("mem://m@x/job", Some("s3cret"))), Some("s3cret"));
        // Without a user, only for a backend whose servers take a password alone (the
        // registry asks the factory; Redis says yes).
        let mut url = with_env("redis://h/job", Some("s3cret"));
        assert_eq!(password(&url), None, "the parser alone does not know Redis");
        url.take_password_from_env(Some("s3cret"), true);
        assert_eq!(password(&url), Some("s3cret"));
    }

    #[test]
    fn rdzv_password_never_overrides_and_is_ignored_without_a_login() {
        assert_eq!(password(&with_env("etcd://root:inline@h/job", Some("env"))), Some("inline"));
        assert_eq!(password(&with_env("etcd://h/job", Some("env"))), None, "no user: no login asked for");
        assert_eq!(password(&with_env("mem://x/job", Some("env"))), None);
        for env in [Some(""), None] {
            let mut url = with_env("redis://h/job", env);
            url.take_password_from_env(env, true);
            assert_eq!(password(&url), None, "empty counts as unset: {env:?}");
        }
        let mut url = with_env("redis://:inline@h/job", None);
        url.take_password_from_env(Some("env"), true);
        assert_eq!(password(&url), Some("inline"));
    }

    #[test]
    fn password_file_wins_over_rdzv_password() {
        let path = std::env::temp_dir().join(format!("rdzv-url-unit-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").expect("write");
        let mut url =
            with_env(&format!("redis://u@h/job?password_file={}", path.display()), Some("from-env"));
        url.take_password_from_env(Some("from-env"), true);
        assert_eq!(password(&url), Some("from-file"));
        let _ = std::fs::remove_file(&path);
    }
}
