//! What the SQLite store needs from the machine: a clock that every process of the machine
//! shares and that wall-clock steps do not move, the identity of the current boot, and whether a
//! file lives on a local file system.
//!
//! On Linux the clock is `CLOCK_BOOTTIME` (milliseconds since the kernel booted, counting
//! suspend), the same for every process of the machine and never stepped by `date -s`, NTP or a
//! container's shifted wall clock. A process in a time namespace with a shifted boot time
//! (`unshare --time --boottime`) reads its offset from `/proc/self/timens_offsets` and takes it
//! off, so it agrees with the rest of the machine. The boot is named by
//! `/proc/sys/kernel/random/boot_id`, which changes at every boot: a file that records another
//! boot id holds only leases of processes that are gone, and the store drops them.
//!
//! Elsewhere (macOS, the BSDs) the clock is the wall clock and the boot id is empty: leases are
//! as good as the wall clock is steady, as before (see the store's docs).

use crate::error::{Error, Result};
use std::path::Path;

/// Milliseconds on the machine's shared clock (see the module docs).
pub(crate) fn now_ms() -> i64 {
    imp::now_ms()
}

/// Milliseconds since the Unix epoch on this process's wall clock (0 before it): only for
/// showing when a hold was granted.
pub(crate) fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The identity of the current boot of the machine ("" where the platform has none).
pub(crate) fn boot_id() -> Result<String> {
    imp::boot_id()
}

/// What kind of file system a path is on, as far as a lock file cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FsKind {
    /// A file system of this machine (or one we cannot tell).
    Local,
    /// A network or cluster file system, by its name (`nfs`, `cifs`, `fuse.sshfs`, ...).
    Network(String),
}

/// The network and cluster file systems by `statfs` magic number (Linux `f_type`).
const NETWORK_MAGIC: &[(i64, &str)] = &[
    (0x6969, "nfs"),
    (0x517B, "smb"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x7375_7245, "coda"),
    (0x5346_414F, "afs"),
    (0x6B41_4653, "afs"),
    (0x564C, "ncp"),
    (0x00C3_6400, "ceph"),
    (0x0102_1997, "9p"),
    (0x0116_1970, "gfs2"),
    (0x7461_636F, "ocfs2"),
    (0x0BD0_0BD0, "lustre"),
    (0x4750_4653, "gpfs"),
    (0x2003_0528, "orangefs"),
];

/// FUSE's magic number: the file system behind it is told by the mount's subtype.
const FUSE_MAGIC: i64 = 0x6573_5546;

/// FUSE file systems (the part after `fuse.` in the mount table) that reach other machines.
const NETWORK_FUSE: &[&str] = &[
    "sshfs",
    "s3fs",
    "glusterfs",
    "rclone",
    "gcsfuse",
    "goofys",
    "juicefs",
    "ceph-fuse",
    "cephfs",
    "mfs",
    "moosefs",
    "lizardfs",
    "beegfs",
    "curlftpfs",
    "davfs",
    "seaweedfs",
    "blobfuse",
    "blobfuse2",
    "cvmfs",
    "osxfuse-nfs",
];

/// Classifies a file system by its `statfs` magic number and, for FUSE, the mount's type in
/// the mount table (`fuse.sshfs`).
pub(crate) fn classify(magic: i64, mount_type: Option<&str>) -> FsKind {
    if let Some((_, name)) = NETWORK_MAGIC.iter().find(|(m, _)| *m == magic) {
        return FsKind::Network((*name).to_string());
    }
    if magic == FUSE_MAGIC {
        if let Some(t) = mount_type {
            let sub = t.strip_prefix("fuse.").unwrap_or(t);
            if NETWORK_FUSE.contains(&sub) {
                return FsKind::Network(t.to_string());
            }
        }
    }
    FsKind::Local
}

/// Refuses a database whose directory is on a network file system: SQLite's locks and the
/// WAL's shared memory do not work across machines there, and each host has its own clock.
pub(crate) fn check_local(db: &Path) -> Result<()> {
    let dir = match db.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d,
        None => Path::new("."),
    };
    match imp::fs_kind(dir) {
        FsKind::Local => Ok(()),
        FsKind::Network(fs) => Err(Error::InvalidConfig(format!(
            "sqlite database {} is on a network file system ({fs}): SQLite's file locks and \
             shared memory do not work across machines there, and each machine has its own \
             clock, so two processes could both be granted a lock. Put the file on a local disk \
             of the one machine whose processes share it, or use a store that spans machines: \
             redis://, postgres://, mysql://, zk://",
            db.display()
        ))),
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use super::{classify, FsKind};
    use crate::error::{Error, Result};
    use std::path::Path;
    use std::sync::OnceLock;

    /// This process's time namespace offset of `CLOCK_BOOTTIME`, in nanoseconds.
    fn boottime_offset_ns() -> i128 {
        static OFFSET: OnceLock<i128> = OnceLock::new();
        *OFFSET.get_or_init(|| {
            // "boottime <secs> <nanos>"; the file is missing on kernels without time namespaces.
            let Ok(text) = std::fs::read_to_string("/proc/self/timens_offsets") else {
                return 0;
            };
            parse_offset(&text)
        })
    }

    pub(super) fn parse_offset(text: &str) -> i128 {
        for line in text.lines() {
            let mut f = line.split_whitespace();
            if f.next() != Some("boottime") {
                continue;
            }
            let secs: i128 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let nanos: i128 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            return secs * 1_000_000_000 + nanos;
        }
        0
    }

    pub(super) fn now_ms() -> i64 {
        use nix::time::{clock_gettime, ClockId};
        // CLOCK_BOOTTIME cannot fail on Linux >= 2.6.39; fall back to the wall clock if it did.
        match clock_gettime(ClockId::CLOCK_BOOTTIME) {
            Ok(t) => {
                let ns = i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
                    - boottime_offset_ns();
                i64::try_from(ns / 1_000_000).unwrap_or(i64::MAX)
            }
            Err(_) => super::wall_ms(),
        }
    }

    pub(super) fn boot_id() -> Result<String> {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .map_err(|e| {
                Error::Unavailable(format!(
                    "cannot read the boot id (/proc/sys/kernel/random/boot_id): {e}"
                ))
            })
    }

    /// The type (`ext4`, `fuse.sshfs`) of the mount that holds `dir`, from the mount table.
    fn mount_type(dir: &Path) -> Option<String> {
        let dir = std::fs::canonicalize(dir).ok()?;
        let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mut best: Option<(usize, String)> = None;
        for line in table.lines() {
            let (left, right) = line.split_once(" - ")?;
            let point = unescape(left.split(' ').nth(4)?);
            let fstype = right.split(' ').next()?.to_string();
            if dir.starts_with(&point) && best.as_ref().map_or(true, |(n, _)| point.len() >= *n) {
                best = Some((point.len(), fstype));
            }
        }
        best.map(|(_, t)| t)
    }

    /// Undoes the mount table's octal escapes (`\040` for a space).
    fn unescape(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 4 <= b.len() {
                let digits = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("");
                if let Ok(v) = u8::from_str_radix(digits, 8) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    pub(super) fn fs_kind(dir: &Path) -> FsKind {
        // A directory we cannot inspect is judged when SQLite opens the file.
        match nix::sys::statfs::statfs(dir) {
            #[allow(clippy::unnecessary_cast)] // fs_type_t differs between libcs
            Ok(st) => classify(st.filesystem_type().0 as i64, mount_type(dir).as_deref()),
            Err(_) => FsKind::Local,
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::FsKind;
    use crate::error::Result;
    use std::path::Path;

    pub(super) fn now_ms() -> i64 {
        super::wall_ms()
    }

    pub(super) fn boot_id() -> Result<String> {
        Ok(String::new())
    }

    pub(super) fn fs_kind(_dir: &Path) -> FsKind {
        FsKind::Local
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_file_systems_are_told_from_local_ones() {
        assert_eq!(classify(0x6969, None), FsKind::Network("nfs".into()));
        assert_eq!(classify(0xFF53_4D42, None), FsKind::Network("cifs".into()));
        assert_eq!(classify(0xFE53_4D42, None), FsKind::Network("smb2".into()));
        assert_eq!(classify(0x0102_1997, None), FsKind::Network("9p".into()));
        assert_eq!(
            classify(FUSE_MAGIC, Some("fuse.sshfs")),
            FsKind::Network("fuse.sshfs".into())
        );
        // ext4, tmpfs, xfs, btrfs, overlayfs, and FUSE file systems of this machine.
        for magic in [0xEF53, 0x0102_1994, 0x5846_5342, 0x9123_683E, 0x794C_7630] {
            assert_eq!(classify(magic, None), FsKind::Local, "{magic:#x}");
        }
        assert_eq!(
            classify(FUSE_MAGIC, Some("fuse.fuse-overlayfs")),
            FsKind::Local
        );
        assert_eq!(classify(FUSE_MAGIC, Some("fuseblk")), FsKind::Local);
        assert_eq!(classify(FUSE_MAGIC, None), FsKind::Local);
    }

    #[test]
    fn a_local_directory_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        check_local(&dir.path().join("locks.db")).unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_shared_clock_is_boot_time_and_the_boot_has_an_id() {
        let a = now_ms();
        let wall = wall_ms();
        assert!(a > 0 && a < wall, "{a} ms since boot, wall clock {wall}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(now_ms() >= a + 20);
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id:?}");
        assert_eq!(
            imp::parse_offset("monotonic 0 0\nboottime 3600 5\n"),
            3_600_000_000_005
        );
        assert_eq!(imp::parse_offset("monotonic 1 0\n"), 0);
    }
}
