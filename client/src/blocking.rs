//! The blocking facade: each call is `block_on` of the async form, so
//! there is one code path for every decision.
//!
//! The runtime has one worker thread of its own, so a [`Lease`]'s keeper
//! goes on renewing while the caller's thread does other work. Do not call
//! these from inside an async runtime: `block_on` there panics (it would
//! stall the runtime's thread). Dropping them anywhere is fine.
//!
//! [`Pipeline`] is the exception: a std socket and no runtime at all, for
//! a thread per connection.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::runtime::Runtime;

pub use crate::blocking_pipeline::Pipeline;
pub use crate::{Config, Error, Grant, LeaseInfo, LeaseLoss, LeaseOptions, Record, StreamStat};

/// The facade's runtime. Shut down without waiting when the last client,
/// lease or tail holding it goes: a plain drop blocks, and panics inside
/// another runtime.
#[derive(Debug)]
struct OwnRuntime(Option<Runtime>);

impl Deref for OwnRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        match &self.0 {
            Some(rt) => rt,
            // Taken only in drop, after which nothing can deref it.
            None => unreachable!("the runtime is taken only when dropped"),
        }
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A blocking [`crate::Client`].
#[derive(Debug, Clone)]
pub struct Client {
    rt: Arc<OwnRuntime>,
    inner: crate::Client,
}

impl Client {
    /// Starts a runtime and connects ([`crate::Client::connect`]).
    pub fn connect(config: Config) -> Result<Client, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fencelog-client")
            .enable_all()
            .build()?;
        let inner = rt.block_on(crate::Client::connect(config))?;
        Ok(Client {
            rt: Arc::new(OwnRuntime(Some(rt))),
            inner,
        })
    }

    /// The async client underneath (it shares the pool and the leader).
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    /// [`crate::Client::ping`].
    pub fn ping(&self) -> Result<(), Error> {
        self.rt.block_on(self.inner.ping())
    }

    /// [`crate::Client::append`].
    pub fn append<R: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: u64,
        records: &[R],
    ) -> Result<u64, Error> {
        self.rt.block_on(self.inner.append(stream, token, records))
    }

    /// [`crate::Client::append_at`].
    pub fn append_at<R: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: u64,
        expected_offset: u64,
        records: &[R],
    ) -> Result<u64, Error> {
        self.rt.block_on(
            self.inner
                .append_at(stream, token, expected_offset, records),
        )
    }

    /// [`crate::Client::fence`].
    pub fn fence(&self, stream: impl AsRef<[u8]>, token: u64) -> Result<u64, Error> {
        self.rt.block_on(self.inner.fence(stream, token))
    }

    /// [`crate::Client::read`].
    pub fn read(
        &self,
        stream: impl AsRef<[u8]>,
        from: u64,
        max_records: u32,
    ) -> Result<Vec<Record>, Error> {
        self.rt.block_on(self.inner.read(stream, from, max_records))
    }

    /// [`crate::Client::read_block`].
    pub fn read_block(
        &self,
        stream: impl AsRef<[u8]>,
        from: u64,
        max_records: u32,
        block: Duration,
    ) -> Result<Vec<Record>, Error> {
        self.rt
            .block_on(self.inner.read_block(stream, from, max_records, block))
    }

    /// [`crate::Client::tail`], blocking.
    pub fn tail(&self, stream: impl AsRef<[u8]>, from: u64, block: Duration) -> Tail {
        Tail {
            rt: self.rt.clone(),
            inner: self.inner.tail(stream, from, block),
        }
    }

    /// [`crate::Client::trim`].
    pub fn trim(&self, stream: impl AsRef<[u8]>, token: u64, before: u64) -> Result<u64, Error> {
        self.rt.block_on(self.inner.trim(stream, token, before))
    }

    /// [`crate::Client::delete`].
    pub fn delete(&self, stream: impl AsRef<[u8]>, token: u64) -> Result<u64, Error> {
        self.rt.block_on(self.inner.delete(stream, token))
    }

    /// [`crate::Client::stat`].
    pub fn stat(&self, stream: impl AsRef<[u8]>) -> Result<StreamStat, Error> {
        self.rt.block_on(self.inner.stat(stream))
    }

    /// [`crate::Client::streams`].
    pub fn streams(&self) -> Result<Vec<Bytes>, Error> {
        self.rt.block_on(self.inner.streams())
    }

    /// [`crate::Client::acquire`].
    pub fn acquire(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        ttl: Duration,
        options: &LeaseOptions,
    ) -> Result<Grant, Error> {
        self.rt
            .block_on(self.inner.acquire(name, owner, ttl, options))
    }

    /// [`crate::Client::renew`].
    pub fn renew(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        token: u64,
        ttl: Duration,
    ) -> Result<Duration, Error> {
        self.rt.block_on(self.inner.renew(name, owner, token, ttl))
    }

    /// [`crate::Client::release`].
    pub fn release(&self, name: impl AsRef<[u8]>, owner: &str, token: u64) -> Result<bool, Error> {
        self.rt.block_on(self.inner.release(name, owner, token))
    }

    /// [`crate::Client::lease_info`].
    pub fn lease_info(&self, name: impl AsRef<[u8]>) -> Result<Option<LeaseInfo>, Error> {
        self.rt.block_on(self.inner.lease_info(name))
    }

    /// [`crate::Client::lease`]: the keeper runs on this client's runtime.
    pub fn lease(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        ttl: Duration,
        options: LeaseOptions,
    ) -> Result<Lease, Error> {
        let inner = self
            .rt
            .block_on(self.inner.lease(name, owner, ttl, options))?;
        Ok(Lease {
            rt: self.rt.clone(),
            inner: Some(inner),
        })
    }
}

/// A blocking [`crate::Tail`].
#[derive(Debug)]
pub struct Tail {
    rt: Arc<OwnRuntime>,
    inner: crate::Tail,
}

impl Tail {
    /// [`crate::Tail::next_record`].
    pub fn next_record(&mut self) -> Result<Option<Record>, Error> {
        self.rt.block_on(self.inner.next_record())
    }

    /// [`crate::Tail::position`].
    pub fn position(&self) -> u64 {
        self.inner.position()
    }
}

/// A blocking [`crate::Lease`]; its keeper runs on the client's runtime.
#[derive(Debug)]
pub struct Lease {
    rt: Arc<OwnRuntime>,
    /// Always `Some` until `release` or drop takes it.
    inner: Option<crate::Lease>,
}

impl Lease {
    fn inner(&self) -> Result<&crate::Lease, Error> {
        self.inner.as_ref().ok_or(Error::Lost)
    }

    /// [`crate::Lease::token`].
    pub fn token(&self) -> u64 {
        self.inner.as_ref().map_or(0, crate::Lease::token)
    }

    /// [`crate::Lease::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.inner.as_ref().is_none_or(crate::Lease::is_lost)
    }

    /// [`crate::Lease::loss`].
    pub fn loss(&self) -> Option<LeaseLoss> {
        match &self.inner {
            Some(l) => l.loss(),
            None => Some(LeaseLoss::Released),
        }
    }

    /// Waits up to `timeout` for [`crate::Lease::lost`]; `None` if the
    /// lease is still held then.
    pub fn wait_lost(&self, timeout: Duration) -> Option<LeaseLoss> {
        let lost = match &self.inner {
            Some(l) => l.lost(),
            None => return Some(LeaseLoss::Released),
        };
        self.rt
            .block_on(async { tokio::time::timeout(timeout, lost).await.ok() })
    }

    /// [`crate::Lease::append`].
    pub fn append<R: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        records: &[R],
    ) -> Result<u64, Error> {
        let inner = self.inner()?;
        self.rt.block_on(inner.append(stream, records))
    }

    /// [`crate::Lease::release`].
    pub fn release(mut self) -> Result<bool, Error> {
        match self.inner.take() {
            Some(l) => self.rt.block_on(l.release()),
            None => Ok(false),
        }
    }

    /// [`crate::Lease::pause_keeper_for_test`].
    #[doc(hidden)]
    pub fn pause_keeper_for_test(&self, d: Duration) {
        if let Some(l) = &self.inner {
            l.pause_keeper_for_test(d);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The async lease's drop spawns its release on the current runtime:
        // make it this client's.
        let _guard = self.rt.enter();
        self.inner.take();
    }
}
