"""The paper's reference points (sne_paper_imagenet.csv), shipped as package data of qkvsearch.reference."""
