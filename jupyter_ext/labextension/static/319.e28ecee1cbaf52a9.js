"use strict";(self.rspackChunkgpusession_lab=self.rspackChunkgpusession_lab||[]).push([[319],{646(e,r,t){var o=t(601),n=t.n(o),a=t(314),s=(t.n(a))()(n());s.push([e.id,`/* gpusession in JupyterLab: only Lab's theme variables, so light and dark themes both read well. */
.gs-sidebar, .gs-admin {
  padding: 8px 12px;
  overflow-y: auto;
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
}
.gs-sidebar h2, .gs-admin h2 { font-size: var(--jp-ui-font-size3); margin: 4px 0 8px; }
.gs-sidebar h3, .gs-admin h3 { font-size: var(--jp-ui-font-size2); margin: 12px 0 4px; }
.gs-table { border-collapse: collapse; width: 100%; }
.gs-table th, .gs-table td { text-align: left; padding: 2px 6px; border-bottom: 1px solid var(--jp-border-color2); }
.gs-table th { color: var(--jp-ui-font-color2); font-weight: normal; }
.gs-lost td { color: var(--jp-error-color1); }
.gs-muted { color: var(--jp-ui-font-color2); }
.gs-error { color: var(--jp-error-color1); }
.gs-error:empty { display: none; }
.gs-run-list { list-style: none; padding: 0; margin: 0; }
.gs-run { padding: 6px 0; border-bottom: 1px solid var(--jp-border-color2); }
.gs-run-head { display: flex; justify-content: space-between; align-items: center; gap: 6px; }
.gs-buttons { display: flex; gap: 4px; }
.gs-run-name { font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.gs-state-ended { opacity: 0.75; }
.gs-state-queued .gs-run-state { color: var(--jp-warn-color0); }
.gs-link {
  background: none; border: none; padding: 0; cursor: pointer; text-align: left;
  color: var(--jp-content-link-color); font: inherit; overflow: hidden; text-overflow: ellipsis;
}
.gs-link:disabled { color: var(--jp-ui-font-color2); cursor: default; }
.gs-link:focus-visible, .gs-statusitem:focus-visible { outline: 1px solid var(--jp-brand-color1); }
.gs-statusitem {
  background: none; border: none; cursor: pointer; padding: 0 4px;
  color: var(--jp-ui-font-color1); font: inherit;
}
.gs-admin input, .gs-admin select {
  background: var(--jp-input-background); color: var(--jp-ui-font-color1);
  border: 1px solid var(--jp-border-color1); width: 8em;
}
.gs-chart { position: relative; height: 280px; }
`,""]),t.d(r,{},{A:s})},314(e){e.exports=function(e){var r=[];return r.toString=function(){return this.map(function(r){var t="",o=void 0!==r[5];return r[4]&&(t+="@supports (".concat(r[4],") {")),r[2]&&(t+="@media ".concat(r[2]," {")),o&&(t+="@layer".concat(r[5].length>0?" ".concat(r[5]):""," {")),t+=e(r),o&&(t+="}"),r[2]&&(t+="}"),r[4]&&(t+="}"),t}).join("")},r.i=function(e,t,o,n,a){"string"==typeof e&&(e=[[null,e,void 0]]);var s={};if(o)for(var i=0;i<this.length;i++){var l=this[i][0];null!=l&&(s[l]=!0)}for(var c=0;c<e.length;c++){var p=[].concat(e[c]);o&&s[p[0]]||(void 0!==a&&(void 0===p[5]||(p[1]="@layer".concat(p[5].length>0?" ".concat(p[5]):""," {").concat(p[1],"}")),p[5]=a),t&&(p[2]&&(p[1]="@media ".concat(p[2]," {").concat(p[1],"}")),p[2]=t),n&&(p[4]?(p[1]="@supports (".concat(p[4],") {").concat(p[1],"}"),p[4]=n):p[4]="".concat(n)),r.push(p))}},r}},601(e){e.exports=function(e){return e[1]}},72(e){var r=[];function t(e){for(var t=-1,o=0;o<r.length;o++)if(r[o].identifier===e){t=o;break}return t}function o(e,o){for(var n={},a=[],s=0;s<e.length;s++){var i=e[s],l=o.base?i[0]+o.base:i[0],c=n[l]||0,p="".concat(l," ").concat(c);n[l]=c+1;var u=t(p),d={css:i[1],media:i[2],sourceMap:i[3],supports:i[4],layer:i[5]};if(-1!==u)r[u].references++,r[u].updater(d);else{var f=function(e,r){var t=r.domAPI(r);return t.update(e),function(r){r?(r.css!==e.css||r.media!==e.media||r.sourceMap!==e.sourceMap||r.supports!==e.supports||r.layer!==e.layer)&&t.update(e=r):t.remove()}}(d,o);o.byIndex=s,r.splice(s,0,{identifier:p,updater:f,references:1})}a.push(p)}return a}e.exports=function(e,n){var a=o(e=e||[],n=n||{});return function(e){e=e||[];for(var s=0;s<a.length;s++){var i=t(a[s]);r[i].references--}for(var l=o(e,n),c=0;c<a.length;c++){var p=t(a[c]);0===r[p].references&&(r[p].updater(),r.splice(p,1))}a=l}}},659(e){var r={};e.exports=function(e,t){var o=function(e){if(void 0===r[e]){var t=document.querySelector(e);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(e){t=null}r[e]=t}return r[e]}(e);if(!o)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");o.appendChild(t)}},540(e){e.exports=function(e){var r=document.createElement("style");return e.setAttributes(r,e.attributes),e.insert(r,e.options),r}},56(e,r,t){e.exports=function(e){var r=t.nc;r&&e.setAttribute("nonce",r)}},206(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var r=e.insertStyleElement(e);return{update:function(t){var o,n,a;o="",t.supports&&(o+="@supports (".concat(t.supports,") {")),t.media&&(o+="@media ".concat(t.media," {")),(n=void 0!==t.layer)&&(o+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),o+=t.css,n&&(o+="}"),t.media&&(o+="}"),t.supports&&(o+="}"),(a=t.sourceMap)&&"u">typeof btoa&&(o+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),e.styleTagTransform(o,r,e.options)},remove:function(){var e;null===(e=r).parentNode||e.parentNode.removeChild(e)}}}},113(e){e.exports=function(e,r){if(r.styleSheet)r.styleSheet.cssText=e;else{for(;r.firstChild;)r.removeChild(r.firstChild);r.appendChild(document.createTextNode(e))}}},959(e,r,t){var o=t(72),n=t.n(o),a=t(206),s=t.n(a),i=t(659),l=t.n(i),c=t(56),p=t.n(c),u=t(540),d=t.n(u),f=t(113),g=t.n(f),v=t(646),h={};h.styleTagTransform=g(),h.setAttributes=p(),h.insert=l().bind(null,"head"),h.domAPI=s(),h.insertStyleElement=d(),n()(v.A,h),v.A&&v.A.locals&&v.A.locals}}]);