"""What autoscalers cannot see, said in terms they read (../shared/docs/AUTOSCALERS.md).

- ``shortfall``: the GPU pods the filter refused on every node offered (the demand);
- ``placeholders``: that demand as placeholder pods of one GPU each, which only a new node
  fits, so cluster-autoscaler and Karpenter add the nodes gpushare needs, GPU by GPU;
- ``scaledown``: which GPU nodes must stay (their GPUs used, or their pods placeable nowhere
  else GPU by GPU), written as the autoscalers' own opt-outs.
"""
