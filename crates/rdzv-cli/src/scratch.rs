//! The temporary directory of an `rdzv run` agent started without `--log-dir`, which holds
//! its workers' error files. The agent removes it when it ends; an agent that is killed
//! (SIGKILL, the OOM killer) cannot, so each directory holds a lock file its agent keeps
//! locked while it lives — the kernel unlocks it when the agent dies — and every agent that
//! starts first removes the `rdzv-run-*` directories whose lock it can take. Without this,
//! each killed agent left a directory in the temporary folder for good.

use std::fs::File;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

const PREFIX: &str = "rdzv-run-";
/// Locked by the directory's agent for as long as it lives.
const LOCK: &str = "agent.lock";
/// The lock file until it is locked: a directory still being made has no [`LOCK`] yet, so
/// no other agent can take its lock and remove it.
const PENDING_LOCK: &str = "agent.lock.new";

/// An agent's temporary directory, removed when this is dropped.
pub struct ScratchDir {
    dir: tempfile::TempDir,
    /// Held open, and so locked, until the directory is removed.
    _lock: File,
}

impl ScratchDir {
    /// Removes the directories that killed agents left in the temporary folder
    /// (`$TMPDIR`, else `/tmp`), then makes this agent's own there.
    pub fn create() -> std::io::Result<ScratchDir> {
        ScratchDir::create_in(&std::env::temp_dir())
    }

    fn create_in(parent: &Path) -> std::io::Result<ScratchDir> {
        remove_abandoned(parent);
        let dir = tempfile::Builder::new().prefix(PREFIX).tempdir_in(parent)?;
        let pending = dir.path().join(PENDING_LOCK);
        let lock = File::create(&pending)?;
        // Nobody else knows this file yet: it cannot be locked already.
        try_lock(&lock)?;
        std::fs::rename(&pending, dir.path().join(LOCK))?;
        Ok(ScratchDir { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes each `rdzv-run-*` directory in `parent` whose lock file this process can lock:
/// its agent is gone. Left alone: directories whose agent lives, those still being made,
/// those without a lock file (made by an rdzv older than this) and other users' (their
/// directories are not readable to this one). Failures are ignored: what is left is another
/// agent's to remove, and must not keep this one from starting.
fn remove_abandoned(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let dir = entry.path();
        let Ok(lock) = File::open(dir.join(LOCK)) else { continue };
        // Held while removing, so that another agent sweeping now leaves it to this one.
        if try_lock(&lock).is_ok()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            tracing::debug!("removing {}, left by an agent that died: {e}", dir.display());
        }
    }
}

/// An exclusive `flock` on `file`, without waiting: it fails if another open file holds one.
/// The kernel releases it when the last descriptor of this open file closes, at the latest
/// when the process dies. (`File::try_lock` is newer than this workspace's oldest Rust.)
fn try_lock(file: &File) -> std::io::Result<()> {
    Ok(flock(file, FlockOperation::NonBlockingLockExclusive)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dirs(parent: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(parent)
            .expect("read the parent")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A directory whose lock file nobody holds, as a killed agent leaves it.
    fn abandoned(parent: &Path, name: &str) -> std::path::PathBuf {
        let dir = parent.join(name);
        std::fs::create_dir_all(dir.join("attempt_0/0")).expect("make the directory");
        std::fs::write(dir.join("attempt_0/0/error.json"), "{}").expect("write an error file");
        File::create(dir.join(LOCK)).expect("make the lock file");
        dir
    }

    #[test]
    fn directories_of_dead_agents_are_removed_and_live_ones_kept() {
        let parent = tempfile::tempdir().expect("temp dir");
        let dead = abandoned(parent.path(), "rdzv-run-dead");
        let other = parent.path().join("not-rdzv");
        std::fs::create_dir(&other).expect("make another directory");
        let older = parent.path().join("rdzv-run-older");
        std::fs::create_dir(&older).expect("make a directory without a lock file");
        let making = parent.path().join("rdzv-run-being-made");
        std::fs::create_dir(&making).expect("make a directory being made");
        File::create(making.join(PENDING_LOCK)).expect("make its pending lock file");

        let live = ScratchDir::create_in(parent.path()).expect("first agent");
        assert!(!dead.exists(), "the dead agent's directory was kept");
        assert!(other.exists() && older.exists() && making.exists(), "{:?}", scratch_dirs(parent.path()));
        assert!(live.path().join(LOCK).exists() && !live.path().join(PENDING_LOCK).exists());

        let next = ScratchDir::create_in(parent.path()).expect("second agent");
        assert!(live.path().exists(), "a live agent's directory was removed");
        assert_ne!(live.path(), next.path());

        let ended = live.path().to_path_buf();
        drop(live);
        assert!(!ended.exists(), "a directory outlived its agent");
        assert!(next.path().exists());
    }
}
