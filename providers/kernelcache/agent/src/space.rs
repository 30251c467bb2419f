//! How much of the node's disk caches may take: a budget for all staged caches together
//! and a floor of free space no stage goes below, each in bytes or as a share of the
//! cache root's filesystem. The cache root usually shares that filesystem with the
//! kubelet and the container runtime, which evict pods when it runs low (kubelet's
//! default hard eviction is at `nodefs.available<10%`), so the floor keeps caches from
//! pushing the node there.
//!
//! [`allowance`] is pure; [`filesystem`] is the one system call.

use std::path::Path;
use std::str::FromStr;

/// A size: bytes (`123456`, or a Kubernetes quantity: `20Gi`, `500M`) or a share of the
/// cache root's filesystem (`10%`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// So many bytes.
    Bytes(u64),
    /// This percentage of the filesystem's size.
    Percent(u8),
}

/// The suffixes of Kubernetes quantities (binary and decimal); fractions are not taken.
const SUFFIXES: [(&str, u64); 8] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
];

impl FromStr for Size {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let s = raw.trim();
        let invalid = || {
            format!(
                "{raw:?}: expected bytes (123456), a quantity (20Gi, 500M) or a share of the \
                 filesystem (10%)"
            )
        };
        if let Some(percent) = s.strip_suffix('%') {
            return match percent.parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => Ok(Self::Percent(p)),
                _ => Err(invalid()),
            };
        }
        let (digits, unit) = SUFFIXES
            .iter()
            .find_map(|(suffix, unit)| s.strip_suffix(suffix).map(|d| (d, *unit)))
            .unwrap_or((s, 1));
        let number: u64 = digits.parse().map_err(|_| invalid())?;
        number
            .checked_mul(unit)
            .map(Self::Bytes)
            .ok_or_else(invalid)
    }
}

impl Size {
    /// In bytes, on a filesystem of `filesystem_bytes`.
    pub fn bytes(self, filesystem_bytes: u64) -> u64 {
        match self {
            Self::Bytes(b) => b,
            Self::Percent(p) => u64::try_from(u128::from(filesystem_bytes) * u128::from(p) / 100)
                .unwrap_or(u64::MAX),
        }
    }
}

/// The cache root's filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filesystem {
    /// Its size.
    pub total: u64,
    /// Bytes free for an unprivileged writer.
    pub free: u64,
}

/// The filesystem of `path`.
pub fn filesystem(path: &Path) -> Result<Filesystem, String> {
    let stat = rustix::fs::statvfs(path)
        .map_err(|e| format!("reading the free space of {}: {e}", path.display()))?;
    Ok(Filesystem {
        total: stat.f_blocks.saturating_mul(stat.f_frsize),
        free: stat.f_bavail.saturating_mul(stat.f_frsize),
    })
}

/// What bounds a stage's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The extraction limit of one layer.
    Layer,
    /// The node's budget for all caches.
    Budget,
    /// The free space the floor leaves.
    Floor,
}

/// The most bytes a new stage may write, and what bounds it: the layer limit, what the
/// budget leaves (`budget` less `used` by caches on disk and stages under way), and the
/// filesystem's free space above `floor`.
pub fn allowance(
    layer_limit: u64,
    budget: Option<(u64, u64)>,
    fs: Filesystem,
    floor: u64,
) -> (u64, Bound) {
    let mut best = (layer_limit, Bound::Layer);
    if let Some((budget, used)) = budget {
        let left = budget.saturating_sub(used);
        if left < best.0 {
            best = (left, Bound::Budget);
        }
    }
    let above_floor = fs.free.saturating_sub(floor);
    if above_floor < best.0 {
        best = (above_floor, Bound::Floor);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_bytes_quantities_or_shares() {
        assert_eq!("123456".parse(), Ok(Size::Bytes(123_456)));
        assert_eq!("20Gi".parse(), Ok(Size::Bytes(20 << 30)));
        assert_eq!("500M".parse(), Ok(Size::Bytes(500_000_000)));
        assert_eq!("10%".parse(), Ok(Size::Percent(10)));
        for bad in [
            "",
            "0%",
            "101%",
            "1.5Gi",
            "-1",
            "20GB",
            "99999999999999999999",
            "20Pi",
        ] {
            let error = bad.parse::<Size>().unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
        assert_eq!(Size::Percent(10).bytes(1_000), 100);
        assert_eq!(Size::Percent(100).bytes(u64::MAX), u64::MAX);
        assert_eq!(Size::Bytes(7).bytes(1_000), 7);
    }

    #[test]
    fn the_tightest_of_layer_budget_and_floor_bounds_a_stage() {
        let fs = Filesystem {
            total: 1_000,
            free: 600,
        };
        assert_eq!(allowance(10_000, None, fs, 100), (500, Bound::Floor));
        assert_eq!(
            allowance(10_000, Some((400, 100)), fs, 100),
            (300, Bound::Budget)
        );
        assert_eq!(
            allowance(200, Some((400, 100)), fs, 100),
            (200, Bound::Layer)
        );
        // Over the budget or under the floor already: nothing.
        assert_eq!(
            allowance(200, Some((400, 500)), fs, 100),
            (0, Bound::Budget)
        );
        assert_eq!(allowance(200, None, fs, 700), (0, Bound::Floor));
    }
}
