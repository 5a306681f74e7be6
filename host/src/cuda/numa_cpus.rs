//! The CPUs near a GPU: those of the NUMA node the system lists for the GPU's PCI device
//! (`/sys/bus/pci/devices/<domain>:<bus>:<device>.0/numa_node`, then
//! `/sys/devices/system/node/node<N>/cpulist`), among those this process may run on. The
//! proxy thread of a GPU's communicator runs there: it reads the FIFO and writes the tail
//! across the GPU's PCIe link, and starts the copies, so a thread on the other socket would
//! pay the inter-socket hop on every trigger.
//!
//! Where the system lists no node (a single-node machine says -1, a VM may list nothing),
//! or the node's CPUs are all outside this process's affinity, there is no placement: the
//! thread runs where the scheduler puts it.

/// Where the system lists PCI devices.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// Where the system lists NUMA nodes.
const NUMA_NODES: &str = "/sys/devices/system/node";

/// The CPUs near the GPU at PCI `(domain, bus, device)` this process may run on, if the
/// system says which they are.
pub(crate) fn cpus_near(pci: (u32, u32, u32)) -> Option<Vec<usize>> {
    let (domain, bus, device) = pci;
    let node_file = format!("{PCI_DEVICES}/{domain:04x}:{bus:02x}:{device:02x}.0/numa_node");
    let node: i64 = std::fs::read_to_string(node_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let node = u32::try_from(node).ok()?;
    let list = std::fs::read_to_string(format!("{NUMA_NODES}/node{node}/cpulist")).ok()?;
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let cpus: Vec<usize> = parse_cpu_list(&list)?
        .into_iter()
        .filter(|&cpu| cpu < rustix::thread::CpuSet::MAX_CPU && allowed.is_set(cpu))
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// The CPUs of a Linux CPU list (`0-3,8,10-11`), in order; `None` for text that is not one.
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let cpu = part.parse::<usize>().ok()?;
                (cpu, cpu)
            }
        };
        // A list names at most a few thousand CPUs: refuse a range that would not fit.
        if last < first || last - first > rustix::thread::CpuSet::MAX_CPU {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list("\n"), Some(vec![]));
        for bad in ["3-1", "a", "0-", "1,,x", "0-99999999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
    }

    /// Guards against a placement that names no CPU or one this process may not use: on
    /// any machine, what comes back (if anything) is a non-empty set of allowed CPUs.
    #[test]
    fn cpus_near_a_device_are_allowed_ones() {
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        // Domain 0, bus 0, device 0 exists on most machines (the host bridge).
        if let Some(cpus) = cpus_near((0, 0, 0)) {
            assert!(!cpus.is_empty());
            assert!(cpus.iter().all(|&c| allowed.is_set(c)), "{cpus:?}");
        }
        assert_eq!(cpus_near((0xffff, 0xff, 0x1f)), None);
    }
}
