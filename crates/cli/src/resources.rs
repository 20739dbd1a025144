//! How much memory this process may still take, so `bench` refuses a size that cannot fit
//! before allocating anything, instead of aborting or waking the OOM killer halfway.
//!
//! Linux only: the figures come from `/proc` and the cgroup file system. Elsewhere, or where
//! they cannot be read, nothing is known and the allocations themselves report failure.

use std::path::Path;

/// The bytes this process can still allocate: the least of the kernel's `MemAvailable`, the
/// room left under the address-space limit (`ulimit -v`), and the room left under the memory
/// cgroup's limit. `None` when none of them can be read.
pub fn host_available_bytes() -> Option<u64> {
    [mem_available(), address_space_left(), cgroup_left()]
        .into_iter()
        .flatten()
        .min()
}

/// `MemAvailable` from `/proc/meminfo`: memory the kernel can hand out without swapping.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemAvailable:")
}

/// A `Name:   123 kB` field, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft address-space limit minus the address space already mapped (`VmSize`).
fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..]
        .split_whitespace()
        .next()?;
    let limit: u64 = soft.parse().ok()?; // "unlimited" does not parse: no limit.
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used = kib_field(&status, "VmSize:").unwrap_or(0);
    Some(limit.saturating_sub(used))
}

/// Room under this process's memory cgroup limit (cgroup v2 `memory.max`, or v1
/// `memory.limit_in_bytes`), less what the group already uses.
fn cgroup_left() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let found = if controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(path);
            room(&dir, "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            // Inside a container the group's own directory is often mounted as the root.
            [
                Path::new("/sys/fs/cgroup/memory").join(path),
                Path::new("/sys/fs/cgroup/memory").to_path_buf(),
            ]
            .iter()
            .find_map(|dir| room(dir, "memory.limit_in_bytes", "memory.usage_in_bytes"))
        } else {
            None
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `limit - usage` read from two files of `dir`; `None` for `max` or unreadable files.
fn room(dir: &Path, limit: &str, usage: &str) -> Option<u64> {
    let read = |f: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(read(limit)?.saturating_sub(read(usage).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_fields_read_as_bytes() {
        let text = "MemTotal:       32000 kB\nMemAvailable:   1024 kB\n";
        assert_eq!(kib_field(text, "MemAvailable:"), Some(1 << 20));
        assert_eq!(kib_field(text, "SwapFree:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_reports_some_available_memory() {
        let bytes = host_available_bytes().expect("/proc/meminfo is readable on Linux");
        assert!(bytes > 0);
    }
}
