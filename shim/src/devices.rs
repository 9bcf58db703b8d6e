//! Device confinement of a container in a systemd scope (cgroup v2), one of the things
//! [`crate::systemd_scope`] completes there.
//!
//! libcgroups 0.7's systemd manager applies no device rule at all: it sets no DeviceAllow on the
//! scope and attaches no eBPF filter, so under the systemd driver a container could open any
//! device node it can make (mknod itself is allowed, as in every runtime: the cgroup decides what
//! opens). runc's systemd manager attaches its device filter to the scope too; the shim does the
//! same, after libcontainer created the container and before any process of it runs user code,
//! with the program libcgroups' cgroupfs managers build (the spec's rules, then the defaults they
//! add), from libcgroups' own rule emulator and program builder.
//!
//! Loading and attaching are sequenced here with libcgroups' bpf calls rather than through its
//! `Devices::apply_devices`, which leaves the program's descriptors open and fails unless it can
//! raise RLIMIT_MEMLOCK to 128 MiB (CAP_SYS_RESOURCE); kernels since 5.11 charge BPF memory to
//! the memory cgroup instead, so the raise is only tried. Programs already attached to the scope
//! stay: with BPF_F_ALLOW_MULTI every attached program must allow an access, so adding one only
//! narrows.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use libcgroups::v2::devices::bpf::prog;
use libcgroups::v2::devices::emulator::Emulator;
use libcgroups::v2::devices::program::Program;
use libcontainer::oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType};

/// NUL-terminated: libcgroups passes the pointer of this &str to the kernel as a C string.
const LICENSE: &str = "Apache\0";

/// What libcgroups' cgroupfs managers allow every container after the spec's rules (its list is
/// crate-private; copied from libcgroups 0.7.0's common.rs `default_allow_devices` and
/// `default_devices`: check it again when libcgroups is upgraded): mknod of any node; null,
/// zero, full, tty, urandom, random; console, pts, ptmx; tun. A container behaves the same under
/// either driver.
const DEFAULTS: [(LinuxDeviceType, Option<i64>, Option<i64>, &str); 12] = [
    (LinuxDeviceType::C, None, None, "m"),
    (LinuxDeviceType::B, None, None, "m"),
    (LinuxDeviceType::C, Some(1), Some(3), "rwm"),
    (LinuxDeviceType::C, Some(1), Some(5), "rwm"),
    (LinuxDeviceType::C, Some(1), Some(7), "rwm"),
    (LinuxDeviceType::C, Some(5), Some(0), "rwm"),
    (LinuxDeviceType::C, Some(1), Some(9), "rwm"),
    (LinuxDeviceType::C, Some(1), Some(8), "rwm"),
    (LinuxDeviceType::C, Some(5), Some(1), "rwm"),
    (LinuxDeviceType::C, Some(136), None, "rwm"),
    (LinuxDeviceType::C, Some(5), Some(2), "rwm"),
    (LinuxDeviceType::C, Some(10), Some(200), "rwm"),
];

/// The device program for a spec's `linux.resources.devices`: deny by default, the spec's rules
/// in order (an `a` rule resets to allow or deny all), then the defaults.
pub fn program(rules: &[LinuxDeviceCgroup]) -> Result<Program, String> {
    let mut emulator = Emulator::with_default_allow(false);
    emulator.add_rules(rules);
    for (typ, major, minor, access) in DEFAULTS {
        let mut rule = LinuxDeviceCgroupBuilder::default().allow(true).typ(typ).access(access);
        if let Some(major) = major {
            rule = rule.major(major);
        }
        if let Some(minor) = minor {
            rule = rule.minor(minor);
        }
        emulator.add_rule(&rule.build().map_err(|e| e.to_string())?);
    }
    Program::from_rules(&emulator.rules, emulator.default_allow)
        .map_err(|e| format!("building the device program: {e}"))
}

/// Attaches `program` to the cgroup directory `dir`.
pub fn attach(dir: &Path, program: &Program) -> Result<(), String> {
    let _ = prog::bump_memlock_rlimit();
    let loaded = prog::load(LICENSE, program.bytecodes()).map_err(|e| format!("loading the device program: {e}"))?;
    // SAFETY: a new descriptor the kernel just returned, owned by nothing else.
    let loaded = unsafe { OwnedFd::from_raw_fd(loaded) };
    let cgroup = std::fs::File::open(dir).map_err(|e| format!("opening {}: {e}", dir.display()))?;
    prog::attach(loaded.as_raw_fd(), cgroup.as_raw_fd())
        .map_err(|e| format!("attaching the device program to {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        allow: bool,
        typ: Option<LinuxDeviceType>,
        major: Option<i64>,
        minor: Option<i64>,
        access: &str,
    ) -> LinuxDeviceCgroup {
        let mut b = LinuxDeviceCgroupBuilder::default().allow(allow).access(access);
        if let Some(typ) = typ {
            b = b.typ(typ);
        }
        if let Some(major) = major {
            b = b.major(major);
        }
        if let Some(minor) = minor {
            b = b.minor(minor);
        }
        b.build().unwrap()
    }

    fn allows(p: &Program, typ: LinuxDeviceType, major: u32, minor: u32, access: &str) -> bool {
        p.execute(typ, major, minor, access.into()).unwrap() == 1
    }

    #[test]
    fn a_container_opens_only_its_devices_and_the_defaults() {
        use LinuxDeviceType::{B, C};
        // As scute's container spec has them: deny all, then a requested device (1:11 read-only).
        let p = program(&[
            rule(false, None, None, None, "rwm"),
            rule(true, Some(C), Some(1), Some(11), "r"),
        ])
        .unwrap();
        assert!(allows(&p, C, 1, 3, "rw"), "/dev/null");
        assert!(allows(&p, C, 136, 4, "rw"), "a pts");
        assert!(allows(&p, C, 1, 11, "r"), "the requested device");
        assert!(
            !allows(&p, C, 1, 11, "w"),
            "the requested device, beyond its permissions"
        );
        assert!(allows(&p, C, 1, 11, "m"), "mknod of anything");
        assert!(!allows(&p, C, 1, 1, "r"), "/dev/mem");
        assert!(!allows(&p, B, 8, 0, "rw"), "a disk");
        assert!(!allows(&p, C, 4, 1, "w"), "a host tty");
    }

    #[test]
    fn a_privileged_container_opens_everything() {
        let p = program(&[rule(true, None, None, None, "rwm")]).unwrap();
        assert!(allows(&p, LinuxDeviceType::B, 8, 0, "rw"));
        assert!(allows(&p, LinuxDeviceType::C, 1, 1, "r"));
    }

    #[test]
    fn a_pause_container_opens_only_the_defaults() {
        let p = program(&[rule(false, None, None, None, "rwm")]).unwrap();
        assert!(allows(&p, LinuxDeviceType::C, 1, 3, "w"));
        assert!(!allows(&p, LinuxDeviceType::C, 1, 11, "w"));
    }
}
