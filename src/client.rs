//! A CRI client over a unix socket, as crictl and the kubelet connect (used by tests, the
//! benchmark and tools).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// Connects to a CRI unix socket. The URI authority is a placeholder: the connector ignores it.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket: PathBuf = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
        }))
        .await
}

/// `scute pulls`: the daemon's pulls in flight, one line each, read from the Admin service on
/// `socket`.
pub async fn pulls_report(socket: &Path) -> anyhow::Result<String> {
    use crate::admin_api::{admin_client::AdminClient, ListPullsRequest};
    let channel = connect(socket)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to {}: {e} (is scute serving there?)", socket.display()))?;
    let pulls = AdminClient::new(channel)
        .list_pulls(ListPullsRequest {})
        .await
        .map_err(|e| anyhow::anyhow!("ListPulls: {}", e.message()))?
        .into_inner()
        .pulls;
    let mut out = String::from("IMAGE\tPHASE\tBYTES\tLAYERS\tELAPSED\tIDLE\n");
    for p in &pulls {
        let percent = (p.bytes_total > 0).then(|| format!(" ({}%)", p.bytes_done * 100 / p.bytes_total));
        out.push_str(&format!(
            "{}\t{}\t{}/{}{}\t{}/{}\t{:.1}s\t{:.1}s\n",
            p.image,
            p.phase,
            p.bytes_done,
            p.bytes_total,
            percent.unwrap_or_default(),
            p.layers_done,
            p.layers_total,
            p.elapsed_ms as f64 / 1000.0,
            p.idle_ms as f64 / 1000.0,
        ));
    }
    if pulls.is_empty() {
        out.push_str("(no pull in flight)\n");
    }
    Ok(out)
}
