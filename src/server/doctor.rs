//! Doctor (Admin): `scute doctor` against the running daemon, so what its pulls, pods and
//! containers hold is respected (the store is the daemon's alone while it runs).

use super::{Cri, RpcError};
use crate::admin_api::{DoctorRequest, DoctorResponse, Finding};
use crate::doctor::{self, Depth};

impl Cri {
    pub(super) async fn doctor(&self, request: DoctorRequest) -> Result<DoctorResponse, RpcError> {
        let depth = if request.quick { Depth::Quick } else { Depth::Full };
        let (images, store) = (self.images.clone(), self.store.clone());
        let (root, state) = (self.config.root.clone(), self.config.state.clone());
        let settled = doctor::runtime::SETTLED;
        let mut findings = tokio::task::spawn_blocking(move || -> Result<Vec<doctor::Finding>, RpcError> {
            let mut found = images.doctor(depth, request.repair)?;
            found.extend(doctor::runtime::examine(
                &store,
                &root,
                &state,
                request.repair,
                settled,
            )?);
            found.extend(doctor::cgroups::examine(&store, &state, request.repair, settled)?);
            Ok(found)
        })
        .await??;
        let cni = self.sandboxes.cni();
        findings.extend(doctor::network::examine(&self.store, cni, request.repair, settled).await?);
        findings.extend(doctor::shims::examine(&self.sandboxes, &self.store, request.repair).await?);
        Ok(DoctorResponse {
            findings: findings.into_iter().map(to_wire).collect(),
        })
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
