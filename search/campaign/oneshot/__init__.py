"""One-shot search (a campaign file's ``supernet`` section, spaces.supernet): one weight-sharing supernet over the
space, its subnets scored with the weights they inherit, the chosen ones retrained on their own.

    plan        the space the supernet serves, its plan, the nested campaign that trains it, a supernet taken
                from another campaign checked to serve this one
    phases      launch and resume: train the supernet (or take a trained one); for each target, score, select
                and export; for each target that retrains, retrain
    scorers     the Ray actors that score subnets on the device Ray gives them, the pool sized by the cluster
    evaluation  subnets proposed by the campaign's searcher under its proposal rules, scored by the actors; a
                target's scoring, selection and export
    retrain     which subnets train on their own (the chosen, a control sample of the space), the campaign
                they train in, and their training
    targets     where each target's phases run: a deployment target (a campaign file's ``targets``) in its
                own folder, its costs measured where it runs; a campaign without targets, in its own
    predictor   a target's measured costs predicted from counted ones once enough shapes are measured
    export      ``qkvsearch export``: any subnet of a trained supernet as a stand-alone checkpoint

Every phase resumes: the supernet's training is a campaign of its own (<exp>/supernet/), the scores are
recorded as they come (search.records.inherited), the retraining is the campaign's own Tune experiment.
"""
