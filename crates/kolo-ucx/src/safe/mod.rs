//! Owning types over the raw calls: a [`worker::Worker`] (context and
//! worker, destroyed in order), [`worker::Endpoint`]s with peer error
//! handling, and [`wait`]ing for requests while progressing the worker.
//! No raw pointer leaves this layer except to [`crate::result`].

pub mod wait;
pub mod worker;
