//! sm_100a kernels.
