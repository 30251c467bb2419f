package main

// The only defaulting of built-in kinds this server does (besides moving a Secret's
// stringData into data, builtin.go): the fields the admission chain (webhooks and
// admission policies) and the webhook service resolver read, which a chart leaves out because
// kube-apiserver fills them in (k8s.io/kubernetes pkg/apis/admissionregistration/v1/defaults.go
// and pkg/apis/core/v1/defaults.go of Kubernetes v1.36; the values are those the
// k8s.io/api field documentation gives). Without them the webhook plugins read a missing
// objectSelector as "match nothing" and the resolver refuses a Service without a type.
// Registered on the scheme, they run where kube-apiserver runs defaulting: when a request
// body is decoded (create, update, patch and server-side apply alike).

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func init() {
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.MutatingWebhookConfiguration{}, func(o interface{}) {
		for i := range o.(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks {
			w := &o.(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks[i]
			defaultWebhook(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector,
				&w.TimeoutSeconds, w.Rules, &w.ClientConfig)
			if w.ReinvocationPolicy == nil {
				never := admissionregistrationv1.NeverReinvocationPolicy
				w.ReinvocationPolicy = &never
			}
		}
	})
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.ValidatingWebhookConfiguration{}, func(o interface{}) {
		for i := range o.(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks {
			w := &o.(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks[i]
			defaultWebhook(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector,
				&w.TimeoutSeconds, w.Rules, &w.ClientConfig)
		}
	})
	// Admission policies: a missing failurePolicy fails closed; missing selectors select
	// everything (the plugin reads a nil selector as "nothing") and a missing matchPolicy
	// is Equivalent; a binding's paramRef denies when its parameter is not found.
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.ValidatingAdmissionPolicy{}, func(o interface{}) {
		spec := &o.(*admissionregistrationv1.ValidatingAdmissionPolicy).Spec
		if spec.FailurePolicy == nil {
			fail := admissionregistrationv1.Fail
			spec.FailurePolicy = &fail
		}
		defaultMatchResources(spec.MatchConstraints)
	})
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, func(o interface{}) {
		spec := &o.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding).Spec
		defaultMatchResources(spec.MatchResources)
		if spec.ParamRef != nil && spec.ParamRef.ParameterNotFoundAction == nil {
			deny := admissionregistrationv1.DenyAction
			spec.ParamRef.ParameterNotFoundAction = &deny
		}
	})
	Scheme.AddTypeDefaultingFunc(&corev1.Service{}, func(o interface{}) {
		spec := &o.(*corev1.Service).Spec
		if spec.Type == "" {
			spec.Type = corev1.ServiceTypeClusterIP
		}
		for i := range spec.Ports {
			p := &spec.Ports[i]
			if p.Protocol == "" {
				p.Protocol = corev1.ProtocolTCP
			}
			if p.TargetPort == (intstr.IntOrString{}) {
				p.TargetPort = intstr.FromInt32(p.Port)
			}
		}
	})
}

func defaultWebhook(failure **admissionregistrationv1.FailurePolicyType, match **admissionregistrationv1.MatchPolicyType,
	namespaces, objects **metav1.LabelSelector, timeout **int32, rules []admissionregistrationv1.RuleWithOperations,
	client *admissionregistrationv1.WebhookClientConfig) {
	if *failure == nil {
		fail := admissionregistrationv1.Fail
		*failure = &fail
	}
	if *match == nil {
		equivalent := admissionregistrationv1.Equivalent
		*match = &equivalent
	}
	if *namespaces == nil {
		*namespaces = &metav1.LabelSelector{}
	}
	if *objects == nil {
		*objects = &metav1.LabelSelector{}
	}
	if *timeout == nil {
		ten := int32(10)
		*timeout = &ten
	}
	for i := range rules {
		if rules[i].Scope == nil {
			all := admissionregistrationv1.AllScopes
			rules[i].Scope = &all
		}
	}
	if client.Service != nil && client.Service.Port == nil {
		port := int32(443)
		client.Service.Port = &port
	}
}

// defaultMatchResources defaults the match criteria of an admission policy or binding, when
// there are any.
func defaultMatchResources(m *admissionregistrationv1.MatchResources) {
	if m == nil {
		return
	}
	if m.MatchPolicy == nil {
		equivalent := admissionregistrationv1.Equivalent
		m.MatchPolicy = &equivalent
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for _, rules := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rules {
			if rules[i].Scope == nil {
				all := admissionregistrationv1.AllScopes
				rules[i].Scope = &all
			}
		}
	}
}
