return { name = "ok", from = "#", select = function(msg) return nil end }
