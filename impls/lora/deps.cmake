set(deps memtrade_model)
