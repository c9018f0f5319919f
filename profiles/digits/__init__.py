"""The "digits" family: small real classifiers (softmax regression and MLPs) trained at set-up on
scikit-learn's bundled data set, their held-out accuracy, and the Triton model that serves them."""
