"""The papers' reference points, shipped as package data of qkvsearch.reference: sne_paper_imagenet.csv (the
SNE paper's ImageNet results, overlaid on reports) and vision_xformers_cifar10.csv (the Vision X-formers
paper's CIFAR-10 tables, which `qkvsearch cost` prints beside its counts: trainers.model.paper_counts)."""
