//! Tests of the fold on cluster topologies: templates time like the plans they stand for.
