"""A multi-host test bed on one Linux machine: hosts as network namespaces on a bridge, running the production
topology (three KRaft Kafka nodes, a producer, a coordinator, two elastic torchrun trainer nodes) on the real
engines, and the faults done to it (`streamtrain cluster ...`, tests/cluster)."""
