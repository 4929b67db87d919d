"""The Flower ServerApp: runs an experiment (train -> unlearn -> evaluate) and hosts the head plug-ins."""
