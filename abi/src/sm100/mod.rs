//! sm_100a (Blackwell) encodings: descriptors, TMEM plan, TMA coordinates, work-list order.
