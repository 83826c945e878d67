"""The whole stack on one machine: broker, producers, coordinator, trainer ranks and Prometheus (`streamtrain up`)."""
