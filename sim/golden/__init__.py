"""The golden fabric model: every router and PE, wavelet by wavelet, in numpy."""
