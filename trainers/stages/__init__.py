"""The tools of the stages after the search (search.campaign.stages runs them):

- transfer: a fine-tuned model's top-1 on its test set and its out-of-distribution scores;
- ood_metrics: the out-of-distribution detection metrics (numpy only).
"""
