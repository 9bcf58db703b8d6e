//! Network counters of a pod: /proc/net/dev as seen from inside its network namespace.

use std::io;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// Parses /proc/net/dev (two header lines, then `name: rx×8 tx×8`); loopback is left out, as
/// the kubelet and cAdvisor leave it out.
pub fn parse_net_dev(text: &str) -> Vec<Interface> {
    text.lines()
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            let n: Vec<u64> = counters.split_whitespace().filter_map(|v| v.parse().ok()).collect();
            if name == "lo" || n.len() < 16 {
                return None;
            }
            Some(Interface {
                name: name.to_string(),
                rx_bytes: n[0],
                rx_errors: n[2],
                tx_bytes: n[8],
                tx_errors: n[10],
            })
        })
        .collect()
}

/// The interfaces of the network namespace pinned at `netns`. setns changes the calling thread's
/// namespace, so a short-lived thread of its own joins it (never a pooled worker) and reads
/// /proc/thread-self/net/dev, which shows the reading thread's namespace.
pub fn interfaces_in(netns: &Path) -> io::Result<Vec<Interface>> {
    let ns = std::fs::File::open(netns)?;
    std::thread::Builder::new()
        .name("scute-netns-stats".into())
        .spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            std::fs::read_to_string("/proc/thread-self/net/dev").map(|t| parse_net_dev(&t))
        })?
        .join()
        .map_err(|_| io::Error::other("the netns stats thread panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev() {
        let text = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0:    5000      40    2    0    0     0          0         0     3000      30    1    0    0     0       0          0
broken: 1 2
";
        assert_eq!(
            parse_net_dev(text),
            vec![Interface {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_errors: 2,
                tx_bytes: 3000,
                tx_errors: 1,
            }]
        );
    }
}
