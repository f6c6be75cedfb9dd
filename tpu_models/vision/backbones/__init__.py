"""Networks both vision families build on, and how published weights map onto them.

    resnet.py  ResNet v1.5: the classifier (registered by vision/classification/resnet.py)
               and, with include_top=False, the detectors' backbone (vision/detection/backbone.py)
"""
