//! How a communicator runs its collectives: sizes of its scratch, launch shape, algorithm.

use super::algorithm::{AlgorithmChoice, Thresholds};
use crate::Device;
use oxccl_device::launch::LaunchConfig;

/// Settings of a communicator's collectives ([`crate::CommunicatorConfig::collectives`]).
/// Every rank must use the same ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveConfig {
    /// Largest all-reduce, in bytes, the packet algorithm takes (and the most any other
    /// collective that takes it sends a peer), and the
    /// packet region of the scratch per peer (each byte of data takes two bytes of
    /// packets). The default,
    /// 1 KiB, is where the direct algorithm overtakes packets on the CPU emulator (`allreduce
    /// --algo packets|direct`, 2 ranks, medians of 6-8 alternated runs: at 2 KiB direct took
    /// 1.21 µs against packets' 1.69 on registered buffers and 1.42 against 1.53 staged; at
    /// 1 KiB they were even registered, packets ahead staged, 1.18 against 1.35); on a GPU,
    /// where a packet costs no thread hand-off, packets pay off to tens of KiB.
    pub packet_limit: u64,
    /// Smallest message (bytes a packet collective sends one peer) that goes as plain data
    /// and one signal instead of LL16 packets (see `oxccl_kernels::collectives::packet_form`);
    /// `None` picks for the device ([`Self::packet_data_from`]): 512 on the CPU emulator,
    /// where 2 ranks all-reduced 1 KiB in 0.62-0.78 µs as data against 0.89-1.18 as packets
    /// and 8-256 B came out even (alternated runs), and never on a GPU, where the release
    /// fence before a signal costs more than packets save at these sizes.
    pub packet_data_bytes: Option<u64>,
    /// Most bytes of the scratch the eager slots of the packet broadcast and reduce take: as
    /// many sets of `n_ranks` slots (a packet slot of `2 * packet_limit` bytes and a data
    /// slot of `packet_limit`) as fit, from 3 to 64, each set a call the sender may run
    /// ahead of its receivers (a sender waits for its receivers only before it writes a set
    /// again). The default, 1 MiB, holds 64 sets at the default [`Self::packet_limit`] up to
    /// 5 ranks (192 KiB a rank), 42 at 8 ranks. Deep is what lets ranks that
    /// share cores run many calls a time slice: 4 ranks on 2 cores took 1.4-1.9 µs a
    /// broadcast of 8-512 B with 64 sets, 3.5-5.3 µs with 3 (`collectives --collective
    /// broadcast --ranks 4`, alternated runs); on a GPU it lets a root's kernels go on while
    /// a slow receiver catches up.
    pub eager_bytes: u64,
    /// Bytes one round of a direct algorithm stages per rank: larger messages run in
    /// several rounds. The scratch holds two rounds. The default, 256 KiB, keeps a round's
    /// staged data in the caches of the CPU emulator's cores.
    pub round_bytes: u64,
    /// Bytes one round of a port-channel collective stages per rank (ranks that reach each
    /// other only through the proxy: another node, Ethernet). A round waits for the network
    /// (twice, in an all-reduce), so these rounds are larger: the default, 1 MiB, took a
    /// 4 MiB all-reduce of 2 ranks over loopback Ethernet 3.5-4.3 ms where rounds of
    /// 256 KiB took 5.4-6.8 ms (alternated runs; 4 MiB rounds were no faster than 1 MiB).
    /// The port scratch holds three rounds and their slots (each collective sends a round
    /// before it is done with the last one).
    pub port_round_bytes: u64,
    /// Smallest all-reduce, in bytes, that the port algorithm puts straight from a
    /// registered input (see
    /// [`Communicator::register_collective_buffer`](crate::Communicator::register_collective_buffer))
    /// instead of staging it through the scratch first; `None` picks for the device
    /// ([`Self::port_direct_from`]): 2 MiB on the CPU emulator, 0 (always) on a GPU. On the
    /// emulator the staging copy leaves a round in the core's cache, where the socket's
    /// copy reads it faster than from a cold input: over loopback Ethernet, 2 ranks
    /// (alternated runs), putting from the input took 64 KiB in 36-39 µs against 30-32
    /// staged, 256 KiB in 121-139 against 77-90, 1 MiB the same (285-300), and 4 MiB in
    /// 1.28-1.52 ms against 1.36-1.59 (in place 1.03-1.07 against 1.17-1.46), 16 MiB in
    /// 5.9-6.2 ms against 6.4-7.5. On a GPU the staging is a copy in device memory that puts
    /// from the input save.
    pub port_direct_bytes: Option<u64>,
    /// Fewest ranks whose all-reduce takes [`Algorithm::Ring`](super::Algorithm::Ring)
    /// rather than [`Algorithm::Ports`](super::Algorithm::Ports) where the ranks reach each
    /// other only through the proxy (where they can load and store each other's memory, the
    /// choice is by size alone). The default is 16. Over loopback Ethernet on a 2-core
    /// machine the two took the same time at 4 and at 8 ranks (64 KiB-16 MiB, alternated
    /// runs, each ahead in some), which says nothing of a real network: there all-pairs
    /// keeps `n - 1` puts of `1 / n` of a round in flight per rank (`n (n - 1)` streams in
    /// the job, each a receiver's work) and the ring one, at `2 (n - 1)` waits a round
    /// instead of 2. Measure on the cluster and set it.
    pub ring_min_ranks: u32,
    /// Largest all-reduce, in bytes, that takes [`Algorithm::Doubling`](super::Algorithm::Doubling)
    /// (recursive doubling, `log2 n` puts a rank) rather than the all-pairs
    /// [`Algorithm::Ports`](super::Algorithm::Ports) (`n - 1` puts) or the ring, where the
    /// ranks reach each other only through the proxy and are a power of two, more than
    /// two. The default, 256 KiB: 4 ranks over loopback Ethernet on a 2-core machine
    /// (medians of 3 alternated runs, out of place and in place) took 64 B-256 KiB in
    /// 0.68-0.98 of the all-pairs ports' time, 1 MiB in 1.23 (each rank sends the whole
    /// message `log2 n` times, the all-pairs two-shot `2 (n - 1) / n` of it). All-gather,
    /// reduce-scatter and broadcast take recursive doubling (halving) at every size where
    /// a small all-reduce takes it (they send the same bytes as the all-pairs algorithms,
    /// in fewer messages); 0 turns it off for all.
    pub doubling_max_bytes: u64,
    /// The grid and block of direct kernels; `None` picks one for the device
    /// ([`Self::launch_for`]). Packet kernels run one block of the same size.
    pub launch: Option<LaunchConfig>,
    /// The algorithm: [`AlgorithmChoice::Auto`] chooses by size (and honours `OXCCL_ALGO`).
    pub algorithm: AlgorithmChoice,
    /// Most buffers registered for the collectives at once
    /// ([`Communicator::register_collective_buffer`](crate::Communicator::register_collective_buffer)).
    pub registered_buffers: u32,
}

/// The settings every rank must share (they place the scratch and pace the protocols), by
/// name, as [`CollectiveConfig::shared_settings`] lists them.
pub(crate) type SharedSettings = [(&'static str, u64); 8];

impl CollectiveConfig {
    /// The smallest packet message sent as data on `device` ([`Self::packet_data_bytes`]
    /// if set).
    pub fn packet_data_from(&self, device: &Device) -> u64 {
        self.packet_data_from_on(device.backend())
    }

    /// The smallest packet message sent as data on a device of `backend`
    /// ([`Self::packet_data_bytes`] if set; `u64::MAX`: never).
    pub fn packet_data_from_on(&self, backend: crate::Backend) -> u64 {
        self.packet_data_bytes.unwrap_or(match backend {
            crate::Backend::Cuda => u64::MAX,
            _ => 512,
        })
    }

    /// The smallest all-reduce the port algorithm puts from a registered input on `device`
    /// ([`Self::port_direct_bytes`] if set).
    pub fn port_direct_from(&self, device: &Device) -> u64 {
        self.port_direct_from_on(device.backend())
    }

    /// The smallest all-reduce the port algorithm puts from a registered input on a device
    /// of `backend` ([`Self::port_direct_bytes`] if set).
    pub fn port_direct_from_on(&self, backend: crate::Backend) -> u64 {
        self.port_direct_bytes.unwrap_or(match backend {
            crate::Backend::Cuda => 0,
            _ => 2 << 20,
        })
    }

    /// The settings that must be the same on every rank, by name, as this rank resolved them
    /// (`packet_data_from` from [`Self::packet_data_from`]): ranks that differ in one would
    /// place their scratch differently or wait for each other in vain, so the set-up
    /// compares them first ([`Self::differs_from`]). The launch shape and the algorithm
    /// choice may differ (each rank's grid is its own; the algorithm is agreed per call).
    pub(crate) fn shared_settings(&self, packet_data_from: u64) -> SharedSettings {
        [
            ("packet_limit", self.packet_limit),
            ("packet_data_bytes", packet_data_from),
            ("eager_bytes", self.eager_bytes),
            ("round_bytes", self.round_bytes),
            ("port_round_bytes", self.port_round_bytes),
            ("ring_min_ranks", u64::from(self.ring_min_ranks)),
            ("doubling_max_bytes", self.doubling_max_bytes),
            ("registered_buffers", u64::from(self.registered_buffers)),
        ]
    }

    /// The shared settings as bytes, for the exchange of [`Self::differs_from`].
    pub(crate) fn shared_bytes(&self, packet_data_from: u64) -> Vec<u8> {
        (self.shared_settings(packet_data_from).iter())
            .flat_map(|(_, v)| v.to_le_bytes())
            .collect()
    }

    /// The first shared setting where `theirs` (another rank's [`Self::shared_bytes`]) is
    /// not ours: its name, our value and theirs (`None` for a value missing or cut short).
    pub(crate) fn differs_from(
        &self,
        packet_data_from: u64,
        theirs: &[u8],
    ) -> Option<(&'static str, u64, Option<u64>)> {
        let mut words = theirs.chunks(8);
        for (name, mine) in self.shared_settings(packet_data_from) {
            let other = words
                .next()
                .and_then(|w| <[u8; 8]>::try_from(w).ok())
                .map(u64::from_le_bytes);
            if other != Some(mine) {
                return Some((name, mine, other));
            }
        }
        None
    }

    /// Where the automatic choice of algorithm changes.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            packet_limit: self.packet_limit,
            ring_min_ranks: self.ring_min_ranks,
            doubling_max_bytes: self.doubling_max_bytes,
        }
    }

    /// The launch shape of direct kernels on `device`: [`Self::launch`] if set, else on the
    /// CPU emulator one block of one thread (each thread is a thread of the host), on a GPU
    /// 16 blocks of 256 threads, or one block per multiprocessor if it has fewer (the
    /// collective kernels synchronize their grid, so every block must be resident: at 144
    /// registers a thread, one block of 256 fits a multiprocessor; on an H200, 16 blocks
    /// took an all-reduce of 60 KiB in 27-38 µs where one block took 226-363).
    pub fn launch_for(&self, device: &Device) -> LaunchConfig {
        if let Some(launch) = self.launch {
            return launch;
        }
        match device.multiprocessors() {
            Some(sms) => LaunchConfig::grid(sms.clamp(1, 16)).block(256),
            None => LaunchConfig::grid(1).block(1),
        }
    }
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        CollectiveConfig {
            packet_limit: 1 << 10,
            eager_bytes: 1 << 20,
            packet_data_bytes: None,
            round_bytes: 256 << 10,
            port_round_bytes: 1 << 20,
            port_direct_bytes: None,
            ring_min_ranks: 16,
            doubling_max_bytes: 256 << 10,
            launch: None,
            algorithm: AlgorithmChoice::Auto,
            registered_buffers: 64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the comparison of the set-up: the same settings agree, and the first that
    /// differs is named with both values, as is a short message.
    #[test]
    fn shared_settings_name_the_first_difference() {
        let mine = CollectiveConfig::default();
        let same = |c: &CollectiveConfig| c.shared_bytes(512);
        assert_eq!(mine.differs_from(512, &same(&mine)), None);
        let theirs = CollectiveConfig {
            eager_bytes: 4096,
            round_bytes: 1 << 20,
            ..mine
        };
        assert_eq!(
            mine.differs_from(512, &same(&theirs)),
            Some(("eager_bytes", 1 << 20, Some(4096)))
        );
        assert_eq!(
            mine.differs_from(512, &same(&mine)[..20]),
            Some(("eager_bytes", 1 << 20, None))
        );
        assert_eq!(
            mine.differs_from(512, &mine.shared_bytes(u64::MAX)),
            Some(("packet_data_bytes", 512, Some(u64::MAX)))
        );
        let launch_only = CollectiveConfig {
            launch: Some(LaunchConfig::grid(2).block(32)),
            ..mine
        };
        assert_eq!(mine.differs_from(512, &same(&launch_only)), None);
        // The emulator's own threshold unless one is set.
        let emulator = Device::cpu(0);
        assert_eq!(mine.packet_data_from(&emulator), 512);
        let set = CollectiveConfig {
            packet_data_bytes: Some(0),
            ..mine
        };
        assert_eq!(set.packet_data_from(&emulator), 0);
    }

    /// Guards the launch shape collectives get: the configured one if set, one thread on the
    /// emulator, a grid of many blocks (at most one a multiprocessor) on a GPU.
    #[test]
    fn collectives_launch_as_configured_or_as_the_device_suits() {
        let emulator = Device::cpu(0);
        let config = CollectiveConfig::default();
        assert_eq!(config.launch_for(&emulator), LaunchConfig::grid(1).block(1));
        let set = CollectiveConfig {
            launch: Some(LaunchConfig::grid(3).block(64)),
            ..config
        };
        assert_eq!(set.launch_for(&emulator), LaunchConfig::grid(3).block(64));
        if let Ok(gpu) = Device::new(crate::Backend::Cuda, 0) {
            let sms = gpu.multiprocessors().expect("a GPU has multiprocessors");
            let launch = config.launch_for(&gpu);
            assert_eq!(launch, LaunchConfig::grid(sms.clamp(1, 16)).block(256));
        }
    }

    /// Guards the size from which the port all-reduce puts from a registered input: the
    /// configured one if set, 2 MiB on the emulator (below it staging measured faster),
    /// every size on a GPU.
    #[test]
    fn port_puts_from_registered_inputs_from_the_size_set_or_the_backend_suits() {
        let config = CollectiveConfig::default();
        assert_eq!(config.port_direct_from_on(crate::Backend::Cpu), 2 << 20);
        assert_eq!(config.port_direct_from_on(crate::Backend::Cuda), 0);
        assert_eq!(config.port_direct_from(&Device::cpu(0)), 2 << 20);
        let set = CollectiveConfig {
            port_direct_bytes: Some(4096),
            ..config
        };
        assert_eq!(set.port_direct_from_on(crate::Backend::Cuda), 4096);
        assert_eq!(set.port_direct_from(&Device::cpu(0)), 4096);
    }
}
