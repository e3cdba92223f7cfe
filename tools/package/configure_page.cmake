# A man page printed by rtd (rtd --print-schema=man) gets the date and version its hand-written
# pages get from configure_file: cmake -DIN -DOUT -DRT_MAN_DATE -DPROJECT_VERSION -P this.
configure_file(${IN} ${OUT} @ONLY)
