//! Placeholder until the SQLite store lands.
use super::*;
#[derive(Debug)]
pub struct SqliteBackend;
impl SqliteBackend {
    pub async fn open(_p: &std::path::Path) -> Result<Self> { Err(crate::Error::Unsupported("sqlite".into())) }
}
#[async_trait::async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str { "sqlite" }
    fn capabilities(&self) -> Capabilities { Capabilities { fencing: true, wakeups: Wakeups::Native, validity: Validity::Lease } }
    async fn acquire(&self, _req: &Request<'_>) -> Result<Attempt> { Err(crate::Error::Unsupported("sqlite".into())) }
    async fn wait(&self, _req: &Request<'_>, _busy: &Busy, _until: Instant) -> Result<()> { Err(crate::Error::Unsupported("sqlite".into())) }
    async fn cancel(&self, _req: &Request<'_>) -> Result<()> { Err(crate::Error::Unsupported("sqlite".into())) }
    async fn release(&self, _hold: &HoldRef<'_>) -> Result<Released> { Err(crate::Error::Unsupported("sqlite".into())) }
    async fn extend(&self, _holds: &[HoldRef<'_>]) -> Result<Vec<Extended>> { Err(crate::Error::Unsupported("sqlite".into())) }
    async fn describe(&self, _prefix: &str) -> Result<Vec<LockInfo>> { Err(crate::Error::Unsupported("sqlite".into())) }
    async fn force_release(&self, _name: &LockName) -> Result<u64> { Err(crate::Error::Unsupported("sqlite".into())) }
}
