"""One-shot search (a campaign file's ``supernet`` section, spaces.supernet): one weight-sharing supernet over the
space, its subnets scored with the weights they inherit, the chosen ones retrained on their own.

    plan        the candidates, the supernet's plan and the nested campaign that trains it
    phases      launch and resume: train the supernet (or take a trained one), score, retrain
    evaluation  subnets scored on Ray by a pool of actors, proposed by the campaign's searcher
    retrain     which subnets train on their own, and the campaign they train in

Every phase resumes: the supernet's training is a campaign of its own (<exp>/supernet/), the scores are
recorded as they come (search.records.inherited), the retraining is the campaign's own Tune experiment.
"""
