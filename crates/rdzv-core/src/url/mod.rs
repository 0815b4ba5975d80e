//! Rendezvous URLs (docs/OPTIONS.md): `scheme://[user:pass@]host:port[,host:port…]/<run_id>?options`,
//! parsed into a [`RendezvousUrl`] (at the crate root); its parts
//! ([`Endpoint`], [`Secret`]), where a run lives ([`RunAddress`]), and the helpers around them.
//!
//! This module knows the generic structure only: scheme, user info, hosts, the path (the
//! run id) and the query options. What a scheme means — its default port, options that
//! change the scheme (etcd's `protocol=https`), run ids it refuses (Redis's database-like
//! paths), whether its servers take a password without a user name — is its backend's
//! [`BackendFactory`](crate::BackendFactory)'s to say; the [`Registry`](crate::Registry)
//! applies it when it parses a URL for a backend.
//!
//! # The run id
//!
//! The URL's path is the run id: one segment, percent-decoded, following the identifier
//! rule of [`validate_id`](crate::ids::validate_id) (ASCII letters, digits, `-` `_` `.` `:`
//! `@` `+`; 1 to 253 characters). A backend may refuse more (see
//! [`BackendFactory::interpret`](crate::BackendFactory::interpret)).
//!
//! # The password
//!
//! A backend's factory finds the password in
//! [`RendezvousUrl::password`](crate::RendezvousUrl::password), wherever it came from; the first of these that applies gives it:
//!
//! 1. the URL itself, `scheme://user:password@host/…` (percent-encoded; visible to anyone
//!    who can read the command line or the environment holding the URL);
//! 2. the option `password_file=<path>`: the file is read when the URL is parsed, its
//!    trailing line breaks are dropped, and it must not be empty; it may not be combined
//!    with a password in the URL. Errors name the path, never the contents;
//! 3. the environment variable `RDZV_PASSWORD` ([`PASSWORD_ENV`]), when the URL gives no
//!    password and names a user (`etcd://user@host/…`), or, through the registry, when its
//!    backend's servers take a password alone (`redis`/`rediss`; see
//!    [`BackendFactory::accepts_password_alone`](crate::BackendFactory::accepts_password_alone)).
//!    An empty value counts as unset. URLs without a user on other schemes ignore it, so a
//!    stray `RDZV_PASSWORD` cannot break an `etcd://` or `mem://` URL that asks for no login.
//!
//! The password never appears in `Display`, `Debug` or any error; [`redact_url_text`]
//! hides it in a URL's original text (as `rdzv run` does for its command's environment).

pub(crate) mod parse;

pub use parse::{Endpoint, PASSWORD_ENV, RunAddress, Secret, URL_OPTIONS, parse_endpoint, redact_url_text};

// `RendezvousUrl` has its one public path at the crate root.
pub(crate) use parse::{RendezvousUrl, scheme_of};
