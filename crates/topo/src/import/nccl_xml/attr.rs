//! Attribute values as NCCL writes them: integers, hex classes, PCI bus ids, link speeds.
//!
//! Every reader returns `Err(message)` naming the attribute and the value it could not read;
//! the caller adds the source name and line.

use roxmltree::Node;

/// A PCI bus id as numbers: domain, bus, device, function.
///
/// NCCL writes `0000:13:00.0`; NVML writes `00000000:13:00.0`; both compare equal here, and
/// case does not matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BusId {
    domain: u32,
    bus: u32,
    device: u32,
    function: u32,
}

impl BusId {
    /// Parse `[domain:]bus:device.function`, each part hexadecimal.
    pub(crate) fn parse(text: &str) -> Option<BusId> {
        let text = text.trim();
        let (head, function) = text.rsplit_once('.')?;
        let mut parts: Vec<&str> = head.split(':').collect();
        let device = parts.pop()?;
        let bus = parts.pop()?;
        let domain = parts.pop().unwrap_or("0");
        if !parts.is_empty() {
            return None;
        }
        let hex = |s: &str, max_digits: usize| -> Option<u32> {
            if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            u32::from_str_radix(s, 16).ok()
        };
        let id = BusId {
            domain: hex(domain, 8)?,
            bus: hex(bus, 2)?,
            device: hex(device, 2)?,
            function: hex(function, 1)?,
        };
        // PCI allows 32 devices per bus and 8 functions per device.
        (id.device < 32 && id.function < 8).then_some(id)
    }
    /// The sysfs spelling, `0000:13:00.0` (NVML's 32-bit domain cut to the 16 bits Linux uses).
    #[cfg(any(feature = "nvml", test))]
    pub(crate) fn sysfs(self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain & 0xffff,
            self.bus,
            self.device,
            self.function
        )
    }
}

/// The text of attribute `name`, trimmed; `None` when absent.
pub(crate) fn text<'a>(node: Node<'a, '_>, name: &str) -> Option<&'a str> {
    node.attribute(name).map(str::trim)
}

/// Byte offset of attribute `name`'s value (for error lines), else of the element.
pub(crate) fn pos(node: Node<'_, '_>, name: &str) -> usize {
    node.attribute_node(name)
        .map(|a| a.range_value().start)
        .unwrap_or(node.range().start)
}

/// An integer attribute, decimal or `0x` hex, that must lie in `min..=max`. `None` when absent
/// or empty.
pub(crate) fn int(
    node: Node<'_, '_>,
    name: &str,
    min: i64,
    max: i64,
) -> Result<Option<i64>, String> {
    let Some(t) = text(node, name).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => t.parse::<i64>().ok(),
    };
    match parsed {
        Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
        Some(v) => Err(format!(
            "{name}=\"{t}\" is out of range ({v} is not in {min}..={max})"
        )),
        None => Err(format!("{name}=\"{t}\" is not a number")),
    }
}

/// A `u32` attribute in `min..=max` (see [`int`]).
pub(crate) fn uint(
    node: Node<'_, '_>,
    name: &str,
    min: u32,
    max: u32,
) -> Result<Option<u32>, String> {
    // The range check in `int` keeps the value inside u32, so the conversion cannot fail.
    Ok(int(node, name, i64::from(min), i64::from(max))?.and_then(|v| u32::try_from(v).ok()))
}

/// A PCI class code such as `0x030200` (24 bits, hex, the `0x` optional). `None` when absent
/// or empty.
pub(crate) fn class(node: Node<'_, '_>, name: &str) -> Result<Option<u32>, String> {
    let Some(t) = text(node, name).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let h = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if h.is_empty() || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{name}=\"{t}\" is not a hex PCI class"));
    }
    match u32::from_str_radix(h, 16) {
        Ok(v) if v <= 0xff_ffff => Ok(Some(v)),
        _ => Err(format!(
            "{name}=\"{t}\" is out of range (a PCI class has 24 bits)"
        )),
    }
}

/// A bus id attribute. `None` when absent or empty.
pub(crate) fn bus_id(node: Node<'_, '_>, name: &str) -> Result<Option<BusId>, String> {
    let Some(t) = text(node, name).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    BusId::parse(t)
        .map(Some)
        .ok_or_else(|| format!("{name}=\"{t}\" is not a PCI bus id like 0000:13:00.0"))
}

/// Default PCIe generation where the file gives no link speed: gen 3 (8 GT/s), the fallback of
/// NCCL's own speed table (`kvDictPciGen` in src/graph/topo.cc).
pub(crate) const DEFAULT_PCIE_GEN: u8 = 3;
/// Default PCIe width where the file gives none or `0`: x16, as NCCL assumes (topo.cc
/// `if (width == 0) width = 16`).
pub(crate) const DEFAULT_PCIE_WIDTH: u32 = 16;

/// The PCIe generation from `link_speed`: `8 GT/s`, `16.0 GT/s PCIe`, `2.5 GT/s`. Absent, empty
/// or `Unknown` (sysfs prints that for a link that is down) gives [`DEFAULT_PCIE_GEN`].
pub(crate) fn link_gen(node: Node<'_, '_>) -> Result<u8, String> {
    let Some(t) = text(node, "link_speed").filter(|t| !t.is_empty()) else {
        return Ok(DEFAULT_PCIE_GEN);
    };
    if t.to_ascii_lowercase().starts_with("unknown") {
        return Ok(DEFAULT_PCIE_GEN);
    }
    let number = t.split_whitespace().next().unwrap_or("");
    match number.parse::<f64>() {
        Ok(gts) if gts.is_finite() && gts > 0.0 && gts <= 256.0 => {
            Ok(crate::rates::pcie_gen_for_gts(gts))
        }
        Ok(_) => Err(format!(
            "link_speed=\"{t}\" is out of range (0 < GT/s <= 256)"
        )),
        Err(_) => Err(format!(
            "link_speed=\"{t}\" is not a speed like \"16 GT/s\""
        )),
    }
}

/// The PCIe width from `link_width`; absent or `0` gives [`DEFAULT_PCIE_WIDTH`].
pub(crate) fn link_width(node: Node<'_, '_>) -> Result<u32, String> {
    Ok(match uint(node, "link_width", 0, 32)? {
        None | Some(0) => DEFAULT_PCIE_WIDTH,
        Some(w) => w,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_across_spellings() {
        let a = BusId::parse("0000:13:00.0").unwrap();
        assert_eq!(BusId::parse("00000000:13:00.0"), Some(a));
        assert_eq!(BusId::parse("13:00.0"), Some(a));
        assert_eq!(BusId::parse("0000:C3:00.0"), BusId::parse("0000:c3:00.0"));
        assert_eq!(a.sysfs(), "0000:13:00.0");
        for bad in [
            "",
            "zz",
            "0000:13:00",
            "0000:13:40.0",
            "0000:13:00.9",
            "1:2:3:4.0",
            "0000:1x:00.0",
        ] {
            assert_eq!(BusId::parse(bad), None, "{bad}");
        }
    }
}
