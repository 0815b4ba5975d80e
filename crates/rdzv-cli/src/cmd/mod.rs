//! One module per subcommand.

pub mod bench;
pub mod close;
pub mod demo;
pub mod exec;
pub mod guard;
pub mod health;
pub mod join;
pub mod run;
pub mod status;
