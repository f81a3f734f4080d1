"""The gpushare-hub kubelet device plugin: advertises GPU memory, allocates the card the extender chose."""
