set(deps memtrade_quant memtrade_model)
