//! sm_90a (Hopper) kernel configuration and parameters.
