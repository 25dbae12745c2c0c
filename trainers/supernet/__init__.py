"""One-shot search's model side: the supernet over a campaign's space (``weights``: its tensors and the subnets
cut from them; ``layout``: how a subnet's parameter maps onto them), its training by the sandwich rule with
in-place distillation (``training``), and subnets scored with the weights they inherit (``scoring``)."""
