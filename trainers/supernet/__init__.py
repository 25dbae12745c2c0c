"""One-shot search's model side: the configurations a supernet serves (``space``: the whole space, its extremes
computed, configurations drawn from all of it), what it is trained over (``plan``), the supernet itself
(``weights``: its tensors and the subnets cut from them; ``layout``: how a subnet's parameter maps onto them), its
training by the sandwich rule with in-place distillation through the engine's update (``training``), and subnets
scored with the weights they inherit (``scoring``)."""
