//! `snapscan explain`: CUDA out-of-memory messages in logs (being written).
