"""The broker's high availability (issue 15): its role (master or slave of its broker name), promotion and
demotion, and a slave's copy of its master's metadata. The replication stream itself is the store's
(broker/store/ha/)."""
