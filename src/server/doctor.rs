//! Doctor (Admin): `scute doctor` against the running daemon, so what its pulls, pods and
//! containers hold is respected (the store is the daemon's alone while it runs).

use super::{Cri, RpcError};
use crate::admin_api::{DoctorRequest, DoctorResponse, Finding};
use crate::doctor::{self, Depth};

impl Cri {
    pub(super) async fn doctor(&self, request: DoctorRequest) -> Result<DoctorResponse, RpcError> {
        let checks = doctor::Checks {
            images: self.images.clone(),
            store: self.store.clone(),
            root: self.config.root.clone(),
            state: self.config.state.clone(),
            cni: self.sandboxes.cni(),
            depth: if request.quick { Depth::Quick } else { Depth::Full },
            repair: request.repair,
            scope: doctor::Scope::Daemon(&self.sandboxes),
        };
        let findings = doctor::examine_all(checks).await?;
        Ok(DoctorResponse {
            findings: findings.into_iter().map(to_wire).collect(),
        })
    }
}

impl From<doctor::CheckError> for RpcError {
    fn from(e: doctor::CheckError) -> Self {
        match e {
            doctor::CheckError::Image(e) => RpcError::Image(e),
            doctor::CheckError::Store(e) => RpcError::Store(e),
            doctor::CheckError::Task(e) => RpcError::from(e),
        }
    }
}

pub fn to_wire(f: doctor::Finding) -> Finding {
    Finding {
        kind: f.kind.as_str().to_string(),
        subject: f.subject,
        bytes: f.bytes,
        detail: f.detail,
        repaired: f.repaired,
    }
}
