"""The simulator: replay a workload against a cluster through gpushare's scheduling policies.

- ``openb``: the openb trace format (the FGD paper's data).
- ``kubeyaml``: Kubernetes manifests read as a workload.
- ``synthetic``: a built-in cluster and workloads, and stress workloads.
- ``mixes``: multi-GPU-heavy mixes built from a trace, by seed.
- ``cards``: GPU cards' memory, and how a model name is matched.
- ``stream``: the paper's arrival stream, shuffled by seed and inflated with clones.
- ``milligpu``: the paper's milli-GPU mode and policies, exactly.
- ``gpumem``: the memory-unit mode, the extender's own core placing the trace.
- ``links``: nodes with a GPU topology, and how well multi-GPU pods were connected.
- ``churn``: the churn protocol, pods arriving and leaving at a steady load.
- ``experiment``: several policies over several seeds, in parallel processes.
- ``churnreport``: the churn protocol's experiment and report.
- ``autoscaling``: the autoscaling protocol, nodes bought on demand and removed when empty.
- ``autoscalereport``: the autoscaling protocol's experiment, table and picture.
- ``seeds``: the process pool and the differences paired by seed the protocols share.
- ``lpbound``: the LP lower bound on unallocated GPU % for any policy.
- ``progress``: progress as plain lines, for logs, pipes and CI.
- ``draplacing``: stock first-fit, gpushare's DRA allocator and device-plugin mode on one replay.
- ``report``: the report: a table, a JSON file with every number, and pictures.
"""
